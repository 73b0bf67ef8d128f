"""From the lines the scanner found to ranked diagnoses: match signatures, extract facts, apply
refinements, separate the root failure from its victims, and build one `Finding` per failure class."""

from __future__ import annotations

import enum
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..collectives import by_op_type
from ..crash_dump import parse_dumps
from ..findings import Evidence, Finding, Fix, Location, Severity
from . import errors, launcher, slowrank, stopped, stopped_text, wrapping
from .knowledge import ClassKnowledge, KnowledgeBase, Refinement, Signature
from .lines import clean, mentioned_rank, rank_segments
from .scanner import PRE, RawHit, ScanStats, Tail, scan
from .source import BLOCK_SIZE, LogSource, read_blocks
from .trigger import Trigger

MAX_EVIDENCE = 6
VICTIM_DISCOUNT = 0.5  # a victim's class when some other class has a root failure in the same log
# Generic traceback structure, true of every class: the innermost frame the user wrote and the exception.
_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]bin[/\\]|<frozen")
_USER_FRAME = re.compile(
    r'File "(?P<user_file>(?![^"]*(?:' + _LIBRARY_PATH.pattern + r'))[^"]+)", '
    r"line (?P<user_line>\d+), in (?P<user_function>[\w<>.]+)"
)
# rich's boxed tracebacks (Lightning, typer): "│ /path/to/fi │" + "│ le.py:12 in f │" is one frame.
_RICH_FRAME = re.compile(
    r"^\s*(?P<user_file>(?![^\s]*(?:site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]bin[/\\]))[^\s\"]+\.py)"
    r":(?P<user_line>\d+) in (?P<user_function>[\w<>.]+)"
)
_BOXED = re.compile(r"^[│┃] ?(?P<content>.*?)\s*[│┃]\s*$")
_EXCEPTION = re.compile(r"(?:^|\s)(?P<exception>(?:[\w.]+\.)?\w*(?:Error|Exception|Warning))\s*:")
_TRACEBACK_START = "Traceback (most recent call last)"
_FATAL_ERROR = "Fatal Python error: "  # faulthandler's dump of a crashing process follows
# What may follow a fatal exception on its rank: more traceback (a chain), nothing else.
_TRACEBACK_LINE = re.compile(
    r"^(?:\s|$|Traceback|During handling|The above exception|[\w.]*(?:Error|Exception|Interrupt)\b)"
)


@dataclass
class SignatureHit:
    signature: Signature
    hit: RawHit
    rank: int | None
    text: str
    facts: dict[str, Any]
    score: float
    refinements: list[Refinement]
    order: int
    consequence: bool = False  # a root signature on a rank that had already reported another failure

    @property
    def role(self) -> str:
        return "victim" if self.consequence else self.signature.role


@dataclass
class Diagnosis:
    """One failure class found in the log: the Finding plus the explanation written for this log."""

    finding: Finding
    explanation: list[str]  # log-specific sentences, most specific first
    knowledge: ClassKnowledge
    # the fixes after the finding's own, when the class's general ones do not fit (a log with no error in it)
    other_fixes: tuple[str, ...] | None = None
    signature: str = ""  # the id of the signature that decided it ("" for a log that stops with no error)
    refinements: tuple[str, ...] = ()  # the ids of the refinements that applied, in order
    log_line: Location | None = None  # the line of the log that decided it (not for stdin: it is no file)

    @property
    def slug(self) -> str:
        return self.finding.class_


class LogKind(enum.Enum):
    """What a log is when no failure is diagnosed in it: what `explain` says in one line."""

    DIAGNOSED = "diagnosed"
    EMPTY = "empty"  # no text at all (or only blank lines)
    NOT_DISTRIBUTED = "not-distributed"  # nothing from a launcher, a rank or torch.distributed
    FINISHED = "finished"  # a distributed job that ended normally
    UNRECOGNISED = "unrecognised"


@dataclass
class Explanation:
    diagnoses: list[Diagnosis]
    stats: ScanStats
    looked_for: list[str]
    sources: list[str] = field(default_factory=list)
    kind: LogKind = LogKind.DIAGNOSED
    job_end: stopped.JobEnd | None = None  # how a distributed job's log ends, when no failure explains it


class _Facts(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> Any:
        raise KeyError(key)


def compact(values: Iterable[Any]) -> str:
    """`0, 1, 2, 3, 5` -> `0-3, 5`: rank lists of large jobs stay readable."""
    items = list(values)
    if not items or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return ", ".join(map(str, items))
    numbers = sorted(set(items))
    runs: list[list[int]] = [[numbers[0], numbers[0]]]
    for number in numbers[1:]:
        if number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    parts = []
    for first, last in runs:
        if last - first >= 2:
            parts.append(f"{first}-{last}")
        else:
            parts += [str(n) for n in range(first, last + 1)]
    return ", ".join(parts)


# Facts holding a c10d `OpType` name (`ALLREDUCE`, `_ALLGATHER_BASE`), and the fact that names its call.
_OP_TYPE_FACTS = {"op_type": "op_call", "op_a": "op_a_call", "op_b": "op_b_call"}


def op_calls(facts: Mapping[str, Any]) -> dict[str, str]:
    """The Python call behind each OpType a log printed (`_ALLGATHER_BASE` → `dist.all_gather_into_tensor`),
    from the shared table of collectives: the first public op that prints it."""
    found = {}
    for fact, call_fact in _OP_TYPE_FACTS.items():
        value = facts.get(fact)
        if not isinstance(value, str):
            continue
        ops = [op for op in by_op_type(value) if not op.name.startswith("_")]
        if ops:
            found[call_fact] = f"dist.{ops[0].name}"
    return found


def fill(template: str, facts: Mapping[str, Any]) -> str | None:
    """The template with facts filled in, or None when a fact it needs is missing."""
    if not template:
        return None
    values = _Facts({k: compact(v) if isinstance(v, (list, tuple)) else v for k, v in facts.items()})
    try:
        return string.Formatter().vformat(template, (), values)
    except (KeyError, IndexError, ValueError):
        return None


def _unbox(lines: list[str]) -> list[str]:
    """Lines of a rich traceback without the box, with paths that rich wrapped at the box edge rejoined."""
    if not any("│" in line or "┃" in line for line in lines):
        return lines
    out: list[str] = []
    joining = False
    for line in lines:
        boxed = _BOXED.match(line)
        if not boxed:
            out.append(line)
            joining = False
            continue
        content = boxed.group("content")
        if joining and out and content and not content.startswith(" "):
            out[-1] += content.strip()
        else:
            out.append(content)
        # a path cut at the box edge continues on the next line
        joining = bool(re.search(r"[/\\]\S*$", content)) and " in " not in content
    return out


def _context(hit: RawHit) -> tuple[int | None, str, list[str], list[str]]:
    """The hit's rank and text, and the lines of the same rank before and after it."""
    prefix_rank, text = clean(hit.raw)
    before = []
    for raw in hit.before:
        for segment in rank_segments(raw):  # ranks glued into one line are lines of their own
            rank, line = clean(segment)
            if rank == prefix_rank:
                before.append(line)
    after = []
    for raw in hit.after:
        for segment in rank_segments(raw):
            rank, line = clean(segment)
            if rank == prefix_rank:
                after.append(line)
    rank = prefix_rank if prefix_rank is not None else mentioned_rank(text)
    return rank, text, _unbox(before), _unbox(after)


def _extract(
    knowledge: ClassKnowledge, text: str, before: list[str], after: list[str], facts: dict[str, Any]
) -> None:
    def search_lines(pattern: re.Pattern[str], lines: Iterable[str]) -> re.Match[str] | None:
        for line in lines:
            found = pattern.search(line)
            if found:
                return found
        return None

    for extractor in knowledge.extractors:
        scope = extractor.scope
        if scope == "line":
            found = extractor.pattern.search(text)
        elif scope == "before":
            found = search_lines(extractor.pattern, reversed(before))
        elif scope == "after":
            found = search_lines(extractor.pattern, after)
        elif scope == "context":
            found = search_lines(extractor.pattern, [*reversed(before), *after])
        else:  # fact:<name>
            source_fact = facts.get(scope[5:])
            found = extractor.pattern.search(str(source_fact)) if source_fact is not None else None
        if not found:
            continue
        groups = {k: v for k, v in found.groupdict().items() if v is not None}
        if extractor.fact and extractor.fact not in facts:
            facts[extractor.fact] = groups.pop(extractor.fact, None) or found.group(0).strip()
        for key, value in groups.items():
            facts.setdefault(key, value)


def _crash_facts(lines: list[str], facts: dict[str, Any]) -> None:
    """`crash_signal`, `crash_frame` and `crash_function` from faulthandler's dump of a crashed rank
    (`PYTHONFAULTHANDLER=1`): the innermost frame the user wrote in the crashing thread's stack, which is
    then also the `user_frame` (the finding's location). The dump of the signal the launcher names, if
    several."""
    dumps = parse_dumps(lines)
    named = [d for d in dumps if d.signal == facts.get("dead_signal")]
    if not (named or dumps):
        return
    dump = (named or dumps)[-1]
    facts.setdefault("crash_signal", dump.signal)
    for path, line, function in dump.stack():
        if not _LIBRARY_PATH.search(path):
            facts.setdefault("crash_frame", f"{path}:{line}")
            facts.setdefault("crash_function", function)
            facts.setdefault("user_frame", f"{path}:{line}")
            facts.setdefault("user_function", function)
            return


def _current_traceback(before: list[str]) -> list[str]:
    """The lines of the traceback that ends at the hit (back to its `Traceback (most recent ...)` line)."""
    for i in range(len(before) - 1, -1, -1):
        if _TRACEBACK_START in before[i]:
            return before[i:]
    return before


def _coerce(value: Any) -> Any:
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,18}", value):
        return int(value)
    return value


def _signature_hit(
    knowledge: ClassKnowledge,
    signature: Signature,
    found: re.Match[str],
    hit: RawHit,
    rank: int | None,
    text: str,
    before: list[str],
    after: list[str],
    context_text: str,
) -> SignatureHit:
    """Facts, rank and score of one signature found on one line."""
    facts: dict[str, Any] = {k: v for k, v in found.groupdict().items() if v is not None}
    _extract(knowledge, text, before, after, facts)
    if signature.role == "root":
        frame = None
        for line in reversed(_current_traceback(before)):
            frame = _USER_FRAME.search(line) or _RICH_FRAME.search(line)
            if frame:
                break
        if frame:
            facts.setdefault("user_frame", f"{frame['user_file']}:{frame['user_line']}")
            facts.setdefault("user_function", frame["user_function"])
        if _FATAL_ERROR in context_text:
            _crash_facts([*before, text, *after], facts)
    exception = _EXCEPTION.search(text)
    if exception:
        facts.setdefault("exception", exception.group("exception").rsplit(".", 1)[-1])
    if "rank" in facts:  # an extractor named the rank (torchrun's summary, a launcher's command line)
        named = _coerce(facts.pop("rank"))
        rank = named if isinstance(named, int) else rank
    score = signature.confidence
    applied = []
    for refinement in knowledge.refinements:
        if refinement.scope != "context":
            continue
        ref_found = refinement.when.search(context_text)
        if ref_found:
            applied.append(refinement)
            score += refinement.confidence
            facts.update(refinement.facts)
            for key, value in ref_found.groupdict().items():
                if value is not None:
                    facts.setdefault(key, value)
    return SignatureHit(
        signature, hit, rank, text, {k: _coerce(v) for k, v in facts.items()}, score, applied, order=0
    )


class Analysis:
    """Accumulates hits from one or more logs (one job) and produces the ranked diagnoses."""

    def __init__(self, kb: KnowledgeBase):
        self.kb = kb
        self.trigger = Trigger(
            [s.pattern for s in kb.signatures]
            + [r.when for _, r in kb.log_refinements]
            + [*launcher.PATTERNS, launcher.WORLD_SIZE, *errors.PATTERNS]
        )
        self.errors = errors.FirstErrors()
        self.known_words = wrapping.vocabulary(s.pattern.pattern for s in kb.signatures)
        self.stats = ScanStats()
        self.hits: list[SignatureHit] = []
        self.log_refinements: dict[str, list[tuple[Refinement, dict[str, Any], RawHit]]] = {}
        self.launcher = launcher.LauncherReport()
        self.ranks_seen: set[int] = set()
        self.sources: list[str] = []
        self._order = 0
        # the marks of a job's start and end (the first few of each kind: they are read, not counted)
        self.starts: list[tuple[str, stopped.Mark]] = []
        self.stops: list[stopped.Stop] = []
        self.finishes: list[stopped.Mark] = []
        self.commands: list[str] = []
        self.scripts: list[str] = []  # named by torchrun's summary
        self.source_ranks: dict[str, int | None] = {}

    def read(self, source: LogSource, block_size: int = BLOCK_SIZE) -> None:
        self.sources.append(source.label)
        self.source_ranks[source.label] = source.rank
        if source.rank is not None:
            # a rank's own log file: that rank exists, even if it said nothing
            self.ranks_seen.add(source.rank)
        blocks = wrapping.unwrap(read_blocks(source, block_size), self.known_words)
        for hit in scan(blocks, self.trigger, source.label, self.stats):
            self.add(hit, source.rank)
        self._read_ends(self.stats.tails[-1])

    def add(self, hit: RawHit, source_rank: int | None = None) -> None:
        rank, text, before, after = _context(hit)
        if rank is None:
            rank = source_rank
        if rank is not None:
            self.ranks_seen.add(rank)
        self.errors.add(text, rank, hit.line, hit.source, after)
        size = launcher.world_size(text)
        if size is not None:
            self.launcher.world_size = max(size, self.launcher.world_size or 0)
        exit_ = launcher.read_exit(text, before, after, hit.line, hit.source)
        if exit_ is not None:
            self.launcher.add(exit_)
        for slug, refinement in self.kb.log_refinements:
            found = refinement.when.search(text)
            if found:
                groups = {k: _coerce(v) for k, v in found.groupdict().items() if v is not None}
                self.log_refinements.setdefault(slug, []).append((refinement, groups, hit))
        context_text = "\n".join([*before, text, *after])
        explained = False
        for fallback in (False, True):
            if fallback and explained:
                break  # a generic signature only speaks for lines nothing specific explains
            for knowledge in self.kb.classes:
                for signature in knowledge.signatures:
                    if signature.fallback != fallback:
                        continue
                    found = signature.pattern.search(text)
                    if not found:
                        continue
                    if signature.requires and not signature.requires.search(context_text):
                        continue
                    if signature.final and not all(_TRACEBACK_LINE.match(line) for line in after):
                        continue  # the rank went on printing: it survived this exception
                    explained = True
                    self._order += 1
                    sig_hit = _signature_hit(
                        knowledge, signature, found, hit, rank, text, before, after, context_text
                    )
                    sig_hit.order = self._order
                    if sig_hit.rank is not None:
                        self.ranks_seen.add(sig_hit.rank)
                    self.hits.append(sig_hit)

    def _read_ends(self, ends: Tail) -> None:
        """The marks of a job's start in a log's first lines, and of its end in its last lines (the log's
        middle is not read for them: `explain` streams it at full speed for failure messages only)."""
        keep = 16
        lines = [(n, line) for n, line in enumerate(ends.head, 1)]
        lines += [(n, line) for n, line in enumerate(ends.lines, ends.first_line) if n > len(ends.head)]
        for number, raw in lines:
            text = clean(raw)[1].strip()
            if not text:
                continue
            mark = stopped.Mark(number, ends.source, text, stopped.timestamp(text))
            for name, pattern in stopped.START_PATTERNS:
                if len(self.starts) < keep and pattern.search(text):
                    self.starts.append((name, mark))
                    break
            size = launcher.world_size(text)
            if size is not None:
                self.launcher.world_size = max(size, self.launcher.world_size or 0)
            command = stopped.read_command(text)
            if command and len(self.commands) < keep:
                self.commands.append(command)
            if number < ends.first_line:
                continue  # a stop or a normal end is at the end of the log
            stop = stopped.read_stop(text, mark)
            if stop is not None and len(self.stops) < keep:
                self.stops.append(stop)
            if stopped.finished(text) and len(self.finishes) < keep:
                self.finishes.append(mark)
            script = stopped.failed_script(text)
            if script and len(self.scripts) < keep:
                self.scripts.append(script)

    def job_end(self) -> stopped.JobEnd | None:
        """How the log of a distributed job ends, or None when nothing in it is distributed."""
        launchers = list(dict.fromkeys(name for name, _ in self.starts))
        command = next((c for c in self.commands if stopped.launcher_of(c)), None) or (
            self.commands[0] if self.commands else None)
        if command and stopped.launcher_of(command):
            launchers.append(stopped.launcher_of(command) or "")
        order = {source: i for i, source in enumerate(self.sources)}
        stop = min(self.stops, key=lambda s: (order.get(s.mark.source, 0), s.mark.line), default=None)
        if stop is not None and stop.command and not command:
            command = stop.command
        if stop is not None and stop.detail.startswith("torchrun"):
            launchers.append("torchrun")
        launchers = list(dict.fromkeys(launchers))
        if "accelerate" in launchers and "torchrun" in launchers:
            # `accelerate launch` runs torchrun's agent: its messages are accelerate's
            launchers.remove("torchrun")
        deaths = [e for e in self.launcher.exits if e.signal]
        if stop is None and deaths and all(e.killed_by_launcher for e in deaths):
            # every rank ended by SIGTERM and nothing else failed: something outside stopped them
            first = min(deaths, key=lambda e: e.line)
            said = f"rank {first.rank} " if first.rank is not None else ""
            mark = stopped.Mark(
                first.line, first.source, f"{said}exitcode {first.exitcode} ({first.signal})", None
            )
            stop = stopped.Stop(mark, first.signal, f"every rank was ended by {first.signal}")
        stop_lines: dict[str, int] = {}
        if stop is not None:
            for other in [*self.stops, stop]:
                stop_lines[other.mark.source] = min(stop_lines.get(other.mark.source, other.mark.line),
                                                    other.mark.line)
        last = stopped.last_lines(self.stats.tails, stop_lines, self.source_ranks)
        ranks = self.ranks_seen | self.launcher.ranks | {e.rank for e in last if e.rank is not None}
        if self.launcher.world_size:
            ranks |= set(range(self.launcher.world_size))
        if ranks:
            ranks |= set(range(max(ranks) + 1))
        if not (launchers or ranks or self.launcher.exits):
            return None
        if stop is not None:
            ending = stopped.Ending.KILLED if stop.signal == "SIGKILL" else stopped.Ending.STOPPED
        else:
            last_line = max((e.line for e in last), default=0)
            done = [m for m in self.finishes if m.line >= last_line]
            ending = stopped.Ending.FINISHED if done else stopped.Ending.CUT_OFF
        return stopped.JobEnd(
            launchers=tuple(launchers),
            ending=ending,
            stop=stop,
            finish=self.finishes[-1] if ending is stopped.Ending.FINISHED else None,
            command=command,
            script=(stopped.script_of(command) if command else None)
            or (self.scripts[0] if self.scripts else None),
            last=tuple(last),
            ranks=tuple(sorted(ranks)),
            tail_lines=max((len(t.lines) for t in self.stats.tails), default=0),
        )

    def stopped_diagnosis(self, end: stopped.JobEnd) -> Diagnosis:
        """The diagnosis of a log that stops with no failure in it: a likely hang, or a killed job."""
        knowledge = self.kb.for_slug(stopped.SLUG[end.ending])
        failure = knowledge.failure
        multi = len(self.sources) > 1
        last = list(end.last)  # oldest first; with many ranks, the earliest to stop printing and the last one
        if len(last) > MAX_EVIDENCE - 1:
            last = [*last[: MAX_EVIDENCE - 2], last[-1]]
        evidence = [
            Evidence(text=(f"{e.source}: " if multi else "") + e.text, line=e.line, rank=e.rank) for e in last
        ]
        if end.stop is not None:
            evidence.append(Evidence(text=end.stop.mark.text, line=end.stop.mark.line))
        finding = Finding(
            class_=failure.slug,
            message=stopped_text.title(end),
            severity=Severity.ERROR,
            fix=Fix(message=stopped_text.next_commands(end)),
            evidence=tuple(evidence),
            references=failure.references,
            facts=stopped_text.facts(end),
            confidence=stopped.CONFIDENCE[end.ending],
        )
        return Diagnosis(finding=finding, explanation=stopped_text.explain(end), knowledge=knowledge,
                         other_fixes=stopped_text.other_fixes(end),
                         log_line=_stopped_line(end))

    # ----------------------------------------------------------------------------------------------
    def diagnoses(self) -> list[Diagnosis]:
        victim_ranks = {h.rank for h in self.hits if h.signature.role == "victim" and h.rank is not None}
        # e.g. a plain `KeyError` on rank 1 matters when rank 0 then lost its peer; alone it is not ours
        self.hits = [
            h
            for h in self.hits
            if not h.signature.with_victims or (h.rank is not None and victim_ranks - {h.rank})
        ]
        deaths = self.launcher.signal_deaths()
        for sig_hit in self.hits:
            # A native abort (gloo's `terminate called ...`) prints no rank prefix; when the launcher saw
            # exactly one rank die by a signal, that rank wrote it.
            if sig_hit.rank is None and sig_hit.signature.role == "root" and len(deaths) == 1:
                sig_hit.rank = deaths[0].rank
        # A rank's first reported failure is its cause; a later one of another class on the same rank (the
        # SIGABRT after an NCCL watchdog timeout or after gloo's size check) is a consequence of it.
        first_class: dict[tuple[str, int], tuple[int, str]] = {}
        for sig_hit in self.hits:
            if sig_hit.rank is None:
                continue
            key = (sig_hit.hit.source, sig_hit.rank)
            if key not in first_class or sig_hit.hit.line < first_class[key][0]:
                first_class[key] = (sig_hit.hit.line, sig_hit.signature.slug)
        for sig_hit in self.hits:
            if sig_hit.rank is None or sig_hit.signature.role != "root":
                continue
            line, slug = first_class[(sig_hit.hit.source, sig_hit.rank)]
            sig_hit.consequence = slug != sig_hit.signature.slug and line < sig_hit.hit.line
        for ranks in self.stats.dropped_ranks.values():
            self.ranks_seen |= ranks
        known_ranks = self.ranks_seen | self.launcher.ranks
        if known_ranks:
            # ranks are 0..N-1: if rank 3 wrote something, ranks 0-2 exist even when they printed nothing
            known_ranks |= set(range(max(known_ranks) + 1))
        if self.launcher.world_size:
            known_ranks |= set(range(self.launcher.world_size))
        by_class: dict[str, list[SignatureHit]] = {}
        for sig_hit in self.hits:
            by_class.setdefault(sig_hit.signature.slug, []).append(sig_hit)
        roots = {slug for slug, hits in by_class.items() if any(h.role == "root" for h in hits)}
        first = self.launcher.first_failure
        out = []
        for slug, hits in by_class.items():
            knowledge = self.kb.for_slug(slug)
            out.append(self._diagnose(knowledge, hits, bool(roots - {slug}), known_ranks, first))
        out.sort(key=lambda d: (-(d.finding.confidence or 0.0), _first_line(d)))
        return out

    def _diagnose(
        self,
        knowledge: ClassKnowledge,
        hits: list[SignatureHit],
        other_roots: bool,
        known_ranks: set[int],
        first: launcher.RankExit | None,
    ) -> Diagnosis:
        failure = knowledge.failure

        def rank_key(h: SignatureHit) -> tuple[float, int, int]:
            on_first = first is not None and h.rank is not None and h.rank == first.rank
            return (-(h.score + (0.01 if on_first else 0.0)), 0 if h.role == "root" else 1, h.order)

        root_hits = [h for h in hits if h.role == "root"]
        victim_hits = [h for h in hits if h.role == "victim"]
        primary = min(root_hits or victim_hits, key=rank_key)
        facts: dict[str, Any] = dict(primary.facts)
        for h in sorted(hits, key=lambda h: h.order):
            if h.role == primary.role:  # a victim's frames say nothing about the root
                for key, value in h.facts.items():
                    facts.setdefault(key, value)
        confidence = primary.score
        refinements = list(primary.refinements)
        for refinement, groups, _ in self.log_refinements.get(failure.slug, []):
            if refinement not in refinements:
                refinements.append(refinement)
                confidence += refinement.confidence
                facts.update(refinement.facts)
                for key, value in groups.items():
                    facts.setdefault(key, value)
        ranks = sorted({h.rank for h in hits if h.rank is not None})
        if ranks:
            facts["ranks"] = ranks
        facts.update(self.launcher.facts())
        if root_hits:
            culprit = min(root_hits, key=rank_key)
            if culprit.rank is not None:
                facts["culprit_rank"] = culprit.rank
            victims = sorted({h.rank for h in victim_hits if h.rank is not None} - {culprit.rank})
            if victims:
                facts["victim_ranks"] = victims
        else:
            reporting_set = {h.rank for h in victim_hits if h.rank is not None}
            for h in victim_hits:  # ranks whose repeats the scanner only counted
                reporting_set |= self.stats.dropped_ranks.get(h.signature.pattern.pattern, set())
            reporting = sorted(reporting_set)
            if reporting:
                facts["reporting_ranks"] = reporting
                silent = sorted(known_ranks - set(reporting))
                if silent:
                    facts["silent_ranks"] = silent
            if other_roots or any(h.consequence for h in hits):
                confidence *= VICTIM_DISCOUNT
        facts["occurrences"] = len(hits)
        facts.update(op_calls(facts))
        explanation = []
        for alternatives in [*(a for r in refinements for a in r.explain), *primary.signature.explain]:
            for template in alternatives:
                sentence = fill(template, facts)
                if sentence:
                    if sentence not in explanation:
                        explanation.append(sentence)
                    break
        fix_text = None
        by_weight = sorted(refinements, key=lambda r: -r.confidence)
        for template in [*(t for r in by_weight for t in r.fix), *primary.signature.fix]:
            fix_text = fill(template, facts)
            if fix_text:
                break
        if not fix_text:
            fix_text = failure.fixes[0] if failure.fixes else ""
        evidence: list[Evidence] = []
        shown: set[tuple[str, int]] = set()
        multi = len(self.sources) > 1
        for h in [primary, *sorted(hits, key=lambda h: (h.hit.source, h.hit.line))]:
            where = (h.hit.source, h.hit.line)
            if where in shown or len(evidence) >= MAX_EVIDENCE:
                continue
            shown.add(where)
            label = f"{h.hit.source}: " if multi else ""
            text = h.text if len(h.text) <= 400 else h.text[:400] + " …"
            evidence.append(Evidence(text=f"{label}{text}" if label else text, line=h.hit.line, rank=h.rank))
        locations: tuple[Location, ...] = ()
        user_frame = str(facts.get("user_frame", ""))
        path, _, line = user_frame.rpartition(":")
        if path and line.isdigit():  # the line the user wrote, for editors and CI annotations
            locations = (Location(path=path, line=int(line), rank=primary.rank),)
        finding = Finding(
            class_=failure.slug,
            message=failure.title,
            severity=Severity.ERROR,
            locations=locations,
            fix=Fix(message=fix_text) if fix_text else None,
            evidence=tuple(evidence),
            references=failure.references,
            facts=facts,
            confidence=round(min(0.99, max(0.01, confidence)), 2),
        )
        return Diagnosis(finding=finding, explanation=explanation, knowledge=knowledge,
                         signature=primary.signature.id, refinements=tuple(r.id for r in refinements),
                         log_line=_log_line(primary.hit.source, primary.hit.line, primary.rank))


def _stopped_line(end: stopped.JobEnd) -> Location | None:
    """The stop from outside, or else the last line a rank printed: where the log shows the job ended."""
    if end.stop is not None:
        return _log_line(end.stop.mark.source, end.stop.mark.line, None)
    return _log_line(end.last[-1].source, end.last[-1].line, end.last[-1].rank) if end.last else None


def _log_line(source: str, line: int, rank: int | None) -> Location | None:
    return None if source == LogSource("-").label else Location(path=source, line=line, rank=rank)


def _first_line(diagnosis: Diagnosis) -> int:
    lines = [e.line for e in diagnosis.finding.evidence if e.line is not None]
    return min(lines) if lines else 0


def _with_first_error(analysis: Analysis, diagnoses: list[Diagnosis]) -> list[Diagnosis]:
    """The diagnoses, with the job's first distributed error outside the catalogue (errors.py) when the log
    has one: a known one always (the timeouts and lost peers after it are its victims), any other error of a
    distributed job only when nothing else was diagnosed."""
    hit, confidence = analysis.errors.first_known(), errors.KNOWN_CONFIDENCE
    if hit is None:
        if diagnoses:
            return diagnoses
        # (a launcher, rank prefixes, torch.distributed: what says the log is a distributed job's)
        distributed = bool(analysis.launcher.exits or analysis.ranks_seen or analysis.starts
                           or analysis.job_end() is not None)
        for tail in analysis.stats.tails:
            analysis.errors.native_end(tail.source, tail.first_line, tail.lines,
                                       analysis.source_ranks.get(tail.source))
        hit, confidence = analysis.errors.first_distributed_exception(distributed), errors.UNKNOWN_CONFIDENCE
        first = analysis.launcher.first_failure
        if hit is None and first is not None and (first.exitcode or 0) > 0:
            # only the launcher's word: a rank exited with an error status, its own output is not in the log
            hit = errors.launcher_exit(first.rank, first.exitcode or 0, first.line, first.source)
        if hit is None:
            return diagnoses
    first_exit = analysis.launcher.first_failure
    if hit.rank is None and first_exit is not None and first_exit.rank is not None:
        hit = replace(hit, rank=first_exit.rank)  # a line with no rank: the launcher's first failed rank
    if not any("culprit_rank" in d.finding.facts for d in diagnoses):
        # a class seen only through victims (a timeout, a lost peer) follows from the error
        diagnoses = [
            replace(d, finding=replace(d.finding,
                                       confidence=round((d.finding.confidence or 0) * VICTIM_DISCOUNT, 2)))
            if "reporting_ranks" in d.finding.facts else d
            for d in diagnoses
        ]
    finding = errors.finding(hit, confidence, analysis.launcher.facts(), None)
    named = Diagnosis(finding=finding, explanation=errors.explanation(hit, dict(finding.facts)),
                      knowledge=errors.knowledge(),
                      signature=hit.known.name if hit.known else "first-failure",
                      log_line=_log_line(hit.source, hit.line, hit.rank))
    return sorted([*diagnoses, named], key=lambda d: (-(d.finding.confidence or 0.0), _first_line(d)))


def _with_slow_rank(analysis: Analysis, diagnoses: list[Diagnosis]) -> list[Diagnosis]:
    """A timeout that only victims reported, read for a rank busy with long work (slowrank.py): then
    `single-rank-long-section` comes first, the timeout after it; a timeout whose late rank the log cannot
    name at all is reported with less confidence."""
    timeout = next((d for d in diagnoses if d.slug == slowrank.TIMEOUT_SLUG
                    and "culprit_rank" not in d.finding.facts), None)
    if timeout is None:
        return diagnoses
    facts = dict(timeout.finding.facts)
    reporting = set(facts.get("reporting_ranks", []))
    # the ranks the log shows lines of (not those inferred from 0..N-1: a paste of one rank's error block
    # says nothing about whether the others were silent)
    seen = reporting | analysis.ranks_seen | analysis.launcher.ranks
    reports = [slowrank.TimeoutReport(h.rank, h.hit.line, h.hit.source, h.facts, h.hit.before, h.hit.raw)
               for h in analysis.hits if h.signature.slug == slowrank.TIMEOUT_SLUG]
    if not reports:
        return diagnoses
    reading = slowrank.read(reports, reporting, seen, set(facts.get("silent_ranks", [])))
    confidence = timeout.finding.confidence or 0.0
    out = [d for d in diagnoses if d is not timeout]
    sentences = slowrank.explanation(reading, reporting)
    if reading.low_timeout:
        facts["configured_timeout_s"] = (reading.timeout_ms or 0) / 1000
    if reading.section is not None or reading.rendezvous:
        section = reading.section
        slow_facts: dict[str, Any] = {k: facts[k] for k in ("reporting_ranks", "silent_ranks", "timeout_ms",
                                                            "configured_timeout_s", "op_type", "seq_num")
                                      if k in facts}
        evidence = list(timeout.finding.evidence[:MAX_EVIDENCE - 1])
        if section is not None:
            slow_facts.update(section=section.kind, section_line=section.line)
            if section.rank is not None:
                slow_facts["section_rank"] = section.rank
            evidence.insert(0, Evidence(text=section.text, line=section.line, rank=section.rank))
        slow_confidence = (slowrank.SECTION_CONFIDENCE if section is not None
                           else slowrank.RENDEZVOUS_CONFIDENCE)
        failure = slowrank.failure_class()
        read = Diagnosis(
            finding=Finding(class_=slowrank.SLUG, message=failure.title, severity=Severity.ERROR,
                            fix=Fix(message=slowrank.fix(reading)), evidence=tuple(evidence),
                            facts=slow_facts, confidence=slow_confidence),
            explanation=sentences, knowledge=slowrank.knowledge(),
            signature="long-section" if section is not None else "barrier-like-wait",
            log_line=_log_line(section.source, section.line, section.rank) if section else timeout.log_line)
        guard = next((d for d in out if d.slug == slowrank.SLUG), None)
        out = [d for d in out if d is not guard]
        out.append(read if guard is None else _joined(guard, read))
        confidence = min(confidence, slowrank.UNCERTAIN_TIMEOUT if section is None else 0.55)
    if reading.single_report:
        confidence = min(confidence, slowrank.UNCERTAIN_TIMEOUT)
    explanation = [*timeout.explanation, *(s for s in sentences[-2:] if "s, far below" in s)]
    diverged = slowrank.positions_sentence(reading)
    if diverged:
        explanation.insert(0, diverged)
        facts["outlier_ranks"] = list(reading.outliers)
    revised = replace(timeout.finding, confidence=round(confidence, 2), facts=facts)
    out.append(replace(timeout, finding=revised, explanation=explanation))
    return sorted(out, key=lambda d: (-(d.finding.confidence or 0.0), _first_line(d)))


def _joined(guard: Diagnosis, read: Diagnosis) -> Diagnosis:
    """One `single-rank-long-section` from the guard's own report (`ddpdoctor run`, it measured the section)
    and the same class read from the log's progress and timeout lines: the guard's report leads, the log's
    reading adds the facts and the evidence the report lacks."""
    facts = {**read.finding.facts, **guard.finding.facts}
    known = guard.finding.evidence
    evidence = [*known, *(e for e in read.finding.evidence if e not in known)]
    finding = replace(guard.finding, facts=facts, evidence=tuple(evidence[:MAX_EVIDENCE]),
                      confidence=max(guard.finding.confidence or 0.0, read.finding.confidence or 0.0))
    explanation = [*guard.explanation, *(s for s in read.explanation if s not in guard.explanation)]
    return replace(guard, finding=finding, explanation=explanation)


def explain_logs(sources: list[LogSource], kb: KnowledgeBase, block_size: int = BLOCK_SIZE) -> Explanation:
    analysis = Analysis(kb)
    for source in sources:
        analysis.read(source, block_size)
    diagnoses = _with_slow_rank(analysis, _with_first_error(analysis, analysis.diagnoses()))
    kind, end = LogKind.DIAGNOSED, None
    if not diagnoses:
        end = analysis.job_end()
        if end is None:
            blank = all(not line.strip() for tail in analysis.stats.tails for line in tail.lines)
            kind = LogKind.EMPTY if blank and analysis.stats.lines <= PRE else LogKind.NOT_DISTRIBUTED
        elif end.ending is stopped.Ending.FINISHED:
            kind = LogKind.FINISHED
        else:
            diagnoses = [analysis.stopped_diagnosis(end)]
    return Explanation(
        diagnoses=diagnoses,
        stats=analysis.stats,
        looked_for=kb.looked_for(),
        sources=analysis.sources,
        kind=kind,
        job_end=end,
    )
