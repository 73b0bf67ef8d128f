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
