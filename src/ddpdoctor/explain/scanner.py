"""Find the lines of a log that the knowledge base cares about, with the lines around them.

The log is read in blocks; the trigger (every signature and log-wide refinement, searched by their literal
anchors first, see trigger.py) is the only work done on every byte. For each line it finds, the scanner keeps
the PRE lines before it (the traceback that led there; carried across blocks in a bounded deque) and the
POST lines after it (the rest of a multi-line message; a block's last POST lines are carried into the next
block before they are searched). Memory is bounded by the block size, the context sizes and HIT_LIMIT,
never by the size of the log.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .lines import ANSI, MAX_TEXT, mentioned_rank, rank_segment, split_rank
from .trigger import Trigger

PRE = 160  # lines kept before a hit: deep Lightning tracebacks on interleaved ranks need this many
POST = 40
HIT_LIMIT = 400  # hits kept with their context per log; later ones are only counted
SAME_KIND_LIMIT = 3  # per rank and pattern: a thousand identical timeouts add nothing after the third
MAX_CARRY = 8 << 20  # a "line" longer than this (no newline in sight) is cut


@dataclass(frozen=True)
class RawHit:
    source: str
    line: int  # 1-based line number in its source
    raw: str  # the whole line, as in the log (colours removed)
    column: int  # where the trigger matched in `raw`
    before: tuple[str, ...]
    after: tuple[str, ...]


HEAD = 200  # first lines kept per log: where launchers print their banner and batch scripts their command


@dataclass(frozen=True)
class Tail:
    """The first and the last lines of one log (HEAD and PRE at most): how a job started, and what a log
    that just stops says last. Read once the log is scanned, they cost nothing per byte."""

    source: str
    first_line: int  # the line number of lines[0]
    lines: tuple[str, ...]
    head: tuple[str, ...] = ()  # lines 1, 2, ...


@dataclass
class ScanStats:
    lines: int = 0
    characters: int = 0
    hits: int = 0
    dropped_hits: int = 0  # over HIT_LIMIT / SAME_KIND_LIMIT: counted, context not kept
    # pattern (as written in the knowledge base) -> ranks of its dropped hits: a 1024-rank watchdog storm
    # still names every reporting rank (bounded by patterns x ranks)
    dropped_ranks: dict[str, set[int]] = field(default_factory=dict)
    tails: list[Tail] = field(default_factory=list)  # one per log read, in order


def _cap(line: str) -> str:
    return line if len(line) <= MAX_TEXT else line[:MAX_TEXT]


def _lines_before(buf: str, end: int, count: int) -> list[str]:
    """Up to `count` lines ending just before offset `end` (a line start), oldest first."""
    out: list[str] = []
    pos = end
    while pos > 0 and len(out) < count:
        previous_start = buf.rfind("\n", 0, pos - 1) + 1
        out.append(_cap(buf[previous_start : pos - 1]))
        pos = previous_start
    out.reverse()
    return out


def _lines_after(buf: str, start: int, count: int) -> list[str]:
    """Up to `count` lines starting at offset `start`."""
    out: list[str] = []
    pos = start
    while pos < len(buf) and len(out) < count:
        end = buf.find("\n", pos)
        if end == -1:
            end = len(buf)
        out.append(_cap(buf[pos:end]))
        pos = end + 1
    return out


def scan(
    blocks: Iterable[tuple[str, bool]], trigger: Trigger, source: str, stats: ScanStats
) -> Iterator[RawHit]:
    carry = ""
    tail: deque[str] = deque(maxlen=PRE)
    head: list[str] = []
    line_base = 0
    kinds: dict[tuple[int | None, str], int] = {}
    kept = 0
    for block, last in blocks:
        stats.characters += len(block)
        buf = carry + block
        if "\r" in buf:
            buf = buf.replace("\r\n", "\n")
        if "\x1b" in buf:
            buf = ANSI.sub("", buf)
        if last:
            cutoff = len(buf)
        else:
            # Keep the last POST lines back: a hit there needs lines from the next block.
            pos = len(buf)
            for _ in range(POST + 1):
                pos = buf.rfind("\n", 0, pos)
                if pos <= 0:
                    break
            cutoff = pos + 1 if pos > 0 else 0
            if cutoff == 0 and len(buf) > MAX_CARRY:
                cutoff = len(buf)
        counted_to, counted = 0, 0
        previous_line_start = -1
        for match in trigger.finditer(buf, 0, cutoff):
            start = buf.rfind("\n", 0, match.start()) + 1
            end = buf.find("\n", match.start())
            if end == -1:
                end = len(buf)
            raw = buf[start:end]
            column = match.start() - start
            # several ranks' outputs glued into one line: each is a line of its own rank
            cut_from, cut_to = rank_segment(raw, column) if "]:" in raw else (0, len(raw))
            if start + cut_from == previous_line_start:
                continue
            previous_line_start = start + cut_from
            counted += buf.count("\n", counted_to, start)
            counted_to = start
            if cut_from or cut_to < len(raw):
                raw, column = raw[cut_from:cut_to], column - cut_from
            stats.hits += 1
            rank, rest = split_rank(raw)
            # per rank and pattern: bounded by ranks x patterns, whatever the matched text
            kind = (rank if rank is not None else mentioned_rank(rest[:400]), match.re.pattern)
            kinds[kind] = kinds.get(kind, 0) + 1
            if kept >= HIT_LIMIT or kinds[kind] > SAME_KIND_LIMIT:
                stats.dropped_hits += 1
                if kind[0] is not None:
                    stats.dropped_ranks.setdefault(trigger.origin[match.re], set()).add(kind[0])
                continue
            kept += 1
            before = _lines_before(buf, start, PRE)
            if len(before) < PRE and tail:
                before = list(tail)[len(tail) - (PRE - len(before)) :] + before
            if len(raw) > MAX_TEXT:  # show a window around the match of an enormous line
                cut = max(0, column - 200)
                raw, column = raw[cut : cut + MAX_TEXT], column - cut
            yield RawHit(
                source=source,
                line=line_base + counted + 1,
                raw=raw,
                column=column,
                before=tuple(before),
                after=tuple(_lines_after(buf, end + 1, POST)),
            )
        region_lines = buf.count("\n", 0, cutoff)
        line_base += region_lines
        stats.lines += region_lines
        if cutoff:
            region = buf[: cutoff - 1] if buf[cutoff - 1 : cutoff] == "\n" else buf[:cutoff]
            tail.extend(_cap(line) for line in region.rsplit("\n", PRE)[-PRE:])
            wanted = HEAD - len(head)
            if wanted > 0:
                head.extend(_cap(line) for line in region.split("\n", wanted)[:wanted])
        partial = 0
        if last and buf and not buf.endswith("\n"):
            stats.lines += 1  # a last line without a newline
            partial = 1
        carry = buf[cutoff:]
        if last:
            lines = tuple(tail)
            stats.tails.append(Tail(source, line_base + partial - len(lines) + 1, lines, tuple(head)))
