"""From the lines the scanner found to ranked diagnoses: match signatures, extract facts, apply
refinements, separate the root failure from its victims, and build one `Finding` per failure class."""

from __future__ import annotations

from typing import Any

from ..findings import Evidence, Finding, Fix, Location, Severity
from . import errors, launcher, stopped, stopped_text, wrapping
from .context import TRACEBACK_LINE, coerce, rank_context, signature_hit
from .knowledge import ClassKnowledge, KnowledgeBase, Refinement
from .lines import clean
from .outcome import Diagnosis, SignatureHit, fill, first_evidence_line, log_location, op_calls
from .scanner import RawHit, ScanStats, Tail, scan
from .source import BLOCK_SIZE, LogSource, read_blocks
from .trigger import Trigger

MAX_EVIDENCE = 6
VICTIM_DISCOUNT = 0.5  # a victim's class when some other class has a root failure in the same log


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
        rank, text, before, after = rank_context(hit)
        if rank is None:
            rank = source_rank
        if rank is not None:
            self.ranks_seen.add(rank)
        self.errors.add(text, rank, hit.line, hit.source, after,
                        fatal=all(TRACEBACK_LINE.match(line) for line in after))
        size = launcher.world_size(text)
        if size is not None:
            self.launcher.world_size = max(size, self.launcher.world_size or 0)
        exit_ = launcher.read_exit(text, before, after, hit.line, hit.source)
        if exit_ is not None:
            self.launcher.add(exit_)
        for slug, refinement in self.kb.log_refinements:
            found = refinement.when.search(text)
            if found:
                groups = {k: coerce(v) for k, v in found.groupdict().items() if v is not None}
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
                    if signature.final and not all(TRACEBACK_LINE.match(line) for line in after):
                        continue  # the rank went on printing: it survived this exception
                    explained = True
                    self._order += 1
                    sig_hit = signature_hit(
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
        out.sort(key=lambda d: (-(d.finding.confidence or 0.0), first_evidence_line(d)))
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
                         log_line=log_location(primary.hit.source, primary.hit.line, primary.rank))


def _stopped_line(end: stopped.JobEnd) -> Location | None:
    """The stop from outside, or else the last line a rank printed: where the log shows the job ended."""
    if end.stop is not None:
        return log_location(end.stop.mark.source, end.stop.mark.line, None)
    return log_location(end.last[-1].source, end.last[-1].line, end.last[-1].rank) if end.last else None
