"""One log line in, (rank, text) out: launcher prefixes, ANSI colours and carriage returns removed.

Launchers tag each line of a rank's output in different ways; all of them are recognised here so that the
rest of `explain` can demultiplex interleaved ranks:

- torchrun >= 2.2 (`[rank1]: ...`), torchrun --tee/--role and older elastic (`[default1]: ...`),
- Lightning's own messages (`[rank: 1] Seed set to 42`),
- `mpirun --tag-output` (`[1,1]<stderr>: ...`), plain `rank 1: ...`,
- what programs print themselves at the start of a line: `rank 1 epoch 0 loss ...`, `RANK=1 ...`
  (not `rank 1 and rank 0 ...`, which is about two ranks).

When a line carries no prefix, the NCCL/c10d form `[Rank 1]` / `[PG ... Rank 1]` inside the message names
the rank that reported it.
"""

from __future__ import annotations

import re

# CSI sequences (colours, cursor movement) and OSC sequences (hyperlinks) as terminals and rich emit them.
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

_PREFIX = re.compile(
    r"""^\s*(?:
        \[(?:rank|default|worker|local_rank|trainer)\s*:?\s*(?P<a>\d+)\](?:<std(?:out|err)>)?:?
      | \[\d+,(?P<b>\d+)\]<std(?:out|err)>:
      | (?i:rank)\s*(?P<c>\d+)\s*:(?!\d)
      | (?i:rank)\s*=\s*(?P<d>\d+)\b[,;:]?
      | (?i:rank)\ (?P<e>\d+)\b(?=\ +[A-Za-z(\[])(?!\ +(?:and|or|of|to)\b)
    )\ ?""",
    re.VERBOSE,
)
# torchrun's per-rank prefixes in the middle of a line: a second rank's output glued to the first's when two
# processes wrote to one terminal without a newline between them
_GLUED = re.compile(r"\[(?:rank|default)\d+\]:")
_MENTION = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")

MAX_TEXT = 4000  # longer lines are cut for display; matching happens on the full line


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text) if "\x1b" in text else text


def split_rank(raw: str) -> tuple[int | None, str]:
    """The rank a launcher prefix names (or None) and the line without it."""
    match = _PREFIX.match(raw)
    if not match:
        return None, raw
    digits = match.group(match.lastgroup or "a")  # each alternative has one group: the one that matched
    return int(digits), raw[match.end() :]


def rank_segment(raw: str, column: int) -> tuple[int, int]:
    """Start and end, in `raw`, of the one rank's output that holds `column`, when several ranks' outputs
    were glued into one physical line (`[rank0]: ...[rank1]: ...`); the whole line otherwise.

    A prefix right after another (`[default0]:[rank0]:`, torchrun --tee over a rank-prefixed line) starts
    no new segment: only one with text of the rank before it does.
    """
    start, end, text_from = 0, len(raw), -1
    for match in _GLUED.finditer(raw):
        if text_from == -1:  # the first prefix on the line
            text_from = match.end()
            if raw[: match.start()].strip():  # unprefixed text before it: a segment of its own
                if column < match.start():
                    return 0, match.start()
                start = match.start()
            continue
        if not raw[text_from : match.start()].strip():
            text_from = match.end()  # stacked prefixes of one rank
            continue
        if column < match.start():
            return start, match.start()
        start, text_from = match.start(), match.end()
    return start, end


def rank_segments(raw: str) -> list[str]:
    """`raw` cut into its ranks' outputs (see rank_segment): one element for a line of one rank."""
    if "]:" not in raw:
        return [raw]
    out, pos = [], 0
    while pos < len(raw):
        start, end = rank_segment(raw, pos)
        out.append(raw[start:end])
        pos = end
    return out or [raw]


def mentioned_rank(text: str) -> int | None:
    """The rank an NCCL/c10d message names in brackets (`[Rank 3] Watchdog caught ...`)."""
    match = _MENTION.search(text)
    return int(match.group(1)) if match else None


def clean(raw: str) -> tuple[int | None, str]:
    """Rank and display text of a raw line: no colours, no prefix, the last carriage-return segment."""
    raw = strip_ansi(raw).rstrip("\r\n")
    rank, text = split_rank(raw)
    if "\r" in text:
        # progress bars redraw with bare CRs; what a terminal would finally show is the last segment
        segments = [s for s in text.split("\r") if s.strip()]
        text = segments[-1] if segments else ""
        if rank is None:
            rank, text = split_rank(text)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + " …"
    return rank, text
