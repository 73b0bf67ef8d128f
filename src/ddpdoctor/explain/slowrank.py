"""Read a collective timeout for a slow rank: one rank busy with long, legitimate work while the others wait.

A timeout says that some ranks waited in a collective for a peer; it does not say why the peer was late. Three
things in the log do, and this module reads them (as values; `diagnose` turns them into findings):

- the last lines before the timeout show a section that is long by nature on a rank that did not report the
  timeout: evaluation or validation, a checkpoint save, tokenising or mapping a dataset, loading a model
  (`LongSection`). Then the peer was busy, not stuck: the class is `single-rank-long-section`, and
  `TORCH_DISTRIBUTED_DEBUG=DETAIL` would find nothing.
- the waiting ranks sit in a barrier-like collective (`BARRIER`, a one-element `ALLREDUCE`, a wait in the
  rendezvous store): they were waiting at a meeting point, which a slow rank reaches late and a stuck one
  never (`rendezvous`); both remain possible.
- the configured timeout is far below torch's default, so a long section outlasts it (`low_timeout`).

And when a single rank reported the timeout and nothing says which ranks exist, the log cannot name the late
rank at all (`single_report`): the timeout is then reported with less confidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..catalogue import CATALOGUE, FailureClass
from .knowledge import ClassKnowledge
from .lines import clean

SLUG = "single-rank-long-section"
TIMEOUT_SLUG = "collective-timeout"
LOOK_BACK = 40  # lines before the first timeout report that count as "the last lines"
LOW_TIMEOUT_MS = 120_000  # torch's defaults are 10 min (NCCL) and 30 min (gloo, the store)
SECTION_CONFIDENCE = 0.7
RENDEZVOUS_CONFIDENCE = 0.45  # an alternative: the log cannot tell a slow rank from a stuck one
UNCERTAIN_TIMEOUT = 0.5  # a timeout whose late rank the log cannot name

# What the section is, by the words programs print when they run it (progress bars, log records).
_SECTIONS = (
    ("evaluation", re.compile(r"(?i)\b(?:eval\w*|validat\w*|testing|predict\w*|inference|generat\w*)")),
    ("checkpoint save",
     re.compile(r"(?i)\b(?:sav(?:e|ing)\b.{0,40}(?:checkpoint|model|state)|checkpoint\w* sav)")),
    ("data preparation", re.compile(
        r"(?i)\b(?:tokeniz\w*|preprocess\w*|map(?:ping)?\b|filter\b|packing|group(?:ing)? texts|download\w*|"
        r"caching|building (?:the )?(?:dataset|index))")),
    ("model loading", re.compile(r"(?i)\bloading (?:checkpoint|model|shards|weights)")),
)
# A line that says work is in progress: a progress bar, a counter, a record that something is being done.
_PROGRESS = re.compile(
    r"\d+%\||\d+/\d+ \[|\d+(?:\.\d+)?\s*(?:it/s|s/it|examples/s|ex/s)|\bstep \d+|"
    r"\w+ing\b.{0,60}(?:\.\.\.|…|to )"
)


@dataclass(frozen=True)
class LongSection:
    kind: str  # "evaluation", "checkpoint save", "data preparation", "model loading"
    rank: int | None  # the rank whose line it is, when it says
    text: str
    line: int
    source: str


@dataclass(frozen=True)
class TimeoutReading:
    section: LongSection | None
    rendezvous: bool
    timeout_ms: int | None
    low_timeout: bool
    single_report: bool
    # rank -> (sequence number, op) where each reporting rank waited; ranks away from the others' position
    positions: tuple[tuple[int, int, str], ...] = ()
    outliers: tuple[int, ...] = ()


@dataclass(frozen=True)
class TimeoutReport:
    """One timeout hit as `diagnose` found it: its rank, line, facts and the raw lines before it."""

    rank: int | None
    line: int
    source: str
    facts: dict[str, object]
    before: Sequence[str]
    raw: str


def read(
    reports: Sequence[TimeoutReport], reporting: set[int], seen_ranks: set[int], silent: set[int]
) -> TimeoutReading:
    """`seen_ranks`: the ranks the log shows lines of; `silent`: the known ranks that reported nothing."""
    first = min(reports, key=lambda r: (r.source, r.line))
    section = _last_section(first, reporting)
    others = silent or (seen_ranks - reporting)
    if section is not None and section.rank is None and len(others) == 1:
        # a line with no rank on it, and one rank that did not report the timeout: that rank's
        section = replace(section, rank=next(iter(others)))
    timeouts = [r.facts.get("timeout_ms") for r in reports]
    timeout_ms = next((int(t) for t in timeouts if isinstance(t, int)), None)
    positions: dict[int, tuple[object, str]] = {}
    for r in sorted(reports, key=lambda r: "op_type" in r.facts):  # a report that names its op wins
        if r.rank is not None and isinstance(r.facts.get("seq_num"), int):
            known_op = positions.get(r.rank, ("", "?"))[1]
            positions[r.rank] = (r.facts["seq_num"], str(r.facts.get("op_type", known_op)))
    outliers = _outliers(positions)
    return TimeoutReading(
        positions=tuple((rank, int(str(seq)), op) for rank, (seq, op) in sorted(positions.items())),
        outliers=outliers,
        section=section,
        # (ranks at different collectives diverged: they are not all waiting at one meeting point)
        rendezvous=not outliers and any(_barrier_like(r.facts) for r in reports),
        timeout_ms=timeout_ms,
        low_timeout=timeout_ms is not None and timeout_ms <= LOW_TIMEOUT_MS,
        single_report=len(reporting) <= 1 and not (seen_ranks - reporting),
    )


def _outliers(positions: dict[int, tuple[object, str]]) -> tuple[int, ...]:
    """The ranks whose position differs from where most reporting ranks wait (all of them on a tie)."""
    ops = {op for _, op in positions.values()} - {"?"}
    if len({seq for seq, _ in positions.values()}) < 2 and len(ops) < 2:
        return ()
    counts: dict[tuple[object, str], int] = {}
    for place in positions.values():
        counts[place] = counts.get(place, 0) + 1
    top = max(counts.values())
    majority = [place for place, n in counts.items() if n == top]
    if len(majority) > 1:
        return tuple(sorted(positions))
    return tuple(sorted(r for r, place in positions.items() if place != majority[0]))


def positions_sentence(reading: TimeoutReading) -> str | None:
    """The sentence for ranks that time out at different collectives: their sequences diverged."""
    if not reading.outliers:
        return None
    where = ", ".join(f"rank {rank} in {op} #{seq}" for rank, seq, op in reading.positions)
    odd = ", ".join(map(str, reading.outliers))
    away = (f"; rank(s) {odd} are away from the others" if len(reading.outliers) < len(reading.positions)
            else "")
    return (f"The ranks that timed out wait at different collectives ({where}): their sequences of "
            f"collectives diverged before this point{away}. Look for a collective that only some ranks make "
            "(a rank-conditional branch, an extra step) before it.")


def _barrier_like(facts: dict[str, object]) -> bool:
    op = str(facts.get("op_type", facts.get("operation", ""))).upper()
    return op == "BARRIER" or (op == "ALLREDUCE" and facts.get("numel_in") == 1) or "store_wait" in facts


def _last_section(report: TimeoutReport, reporting: set[int]) -> LongSection | None:
    """The last long-section progress line before the first timeout report, on a rank that is not among
    those that reported the timeout (or on no rank in particular)."""
    lines: list[tuple[int | None, str]] = [clean(raw) for raw in report.before[-LOOK_BACK:]]
    glued = _unglued(clean(report.raw)[1])
    if glued != clean(report.raw)[1]:
        lines.append((None, glued))  # a progress bar the report was glued to (no newline between them)
    for offset, (rank, text) in enumerate(reversed(lines)):
        text = _unglued(text)
        if rank is not None and rank in reporting:
            continue
        if not _PROGRESS.search(text):
            continue
        for kind, pattern in _SECTIONS:
            if pattern.search(text):
                line = max(report.line - offset - (0 if glued != clean(report.raw)[1] else 1), 1)
                shown = text if len(text) <= 200 else text[:200] + " …"
                return LongSection(kind, rank, shown.strip(), line, report.source)
    return None


def _unglued(text: str) -> str:
    """A progress bar without the log record printed onto its line (a bar redrawn without a newline)."""
    cut = min((i for i in (text.find(m) for m in ("[rank", "[E", "[W", "[I")) if i > 0), default=-1)
    return text[:cut] if cut > 0 else text


def failure_class() -> FailureClass:
    if SLUG in CATALOGUE:
        return CATALOGUE.get(SLUG)
    return FailureClass(
        id="", slug=SLUG, title="One rank runs a long section while the others wait in a collective",
        summary="A legitimately long piece of work on one rank (evaluation, a checkpoint save, data "
                "preparation) "
                "outlasts the collective timeout of the ranks that wait for it.",
        symptoms=(), why="", rules=(), references=(),
        fixes=(
            "Run the section on every rank (each its shard), or let the other ranks wait somewhere without a "
            "deadline: do it before `init_process_group`, or cache its result and load it on every rank",
            "Give that wait a longer timeout: `init_process_group(timeout=timedelta(hours=2))`, a separate "
            "group for the section (`dist.new_group(timeout=...)`), `ddp_timeout` in transformers' "
            "TrainingArguments, `InitProcessGroupKwargs(timeout=...)` in accelerate",
            "For data preparation: prepare once (`main_process_first`, a cached dataset) before the ranks "
            "start waiting on each other",
        ),
    )


def knowledge() -> ClassKnowledge:
    return ClassKnowledge(failure_class(), (), (), ())


def explanation(reading: TimeoutReading, reporting: Iterable[int]) -> list[str]:
    waiting = ", ".join(map(str, sorted(reporting))) or "?"
    out = []
    section = reading.section
    if section is not None:
        who = f"rank {section.rank}" if section.rank is not None else "a rank that did not report the timeout"
        out.append(
            f"Rank(s) {waiting} timed out waiting in a collective while {who} was still in {section.kind} "
            f"(line {section.line}: `{section.text}`): the late rank was busy, not stuck."
        )
    elif reading.rendezvous:
        out.append(
            f"Rank(s) {waiting} timed out in a barrier-like collective (a barrier, a one-element "
            f"all_reduce, a "
            "wait in the store): a meeting point that a rank busy with long work (evaluation, a save, data "
            "preparation) reaches late; the log does not show which rank, or whether it was busy or stuck."
        )
    if reading.low_timeout and reading.timeout_ms is not None:
        out.append(
            f"The timeout was set to {reading.timeout_ms / 1000:g} s, far below torch's defaults (10 min for "
            "NCCL, 30 min for gloo and the store): a long section on one rank outlasts it."
        )
    out.append("TORCH_DISTRIBUTED_DEBUG=DETAIL finds nothing here: no rank called a different collective.")
    return out


def fix(reading: TimeoutReading) -> str:
    section = reading.section
    kind = section.kind if section is not None else "the long section"
    rank = f" on rank {section.rank}" if section is not None and section.rank is not None else ""
    if section is not None and section.kind == "data preparation":
        return ("Prepare the data before the ranks wait on each other (once, cached, then loaded by every "
                "rank), "
                "or give that wait a longer timeout (`init_process_group(timeout=timedelta(hours=2))`, "
                "`ddp_timeout` in transformers)")
    return (f"Let the other ranks share {kind}{rank} (each on its shard), or give them a longer timeout "
            f"for it "
            f"(`init_process_group(timeout=...)`, a separate `dist.new_group(timeout=...)` for that section, "
            f"`ddp_timeout` / `InitProcessGroupKwargs`)")
