"""Undo the wrapping that terminals and people add to a log before it is pasted, keeping line numbers.

A program writes a log one message per line; a terminal cuts long lines at its width, a person pasting into
an issue cuts them by hand, and torchrun repeats the `[rankN]:` prefix on the continuation. A message cut in
two matches no pattern (`...WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeo` / `ut(ms)=600000) ran for ...`).

Only logs that fit in one block are rejoined (`unwrap`): wrapping comes from terminals and people, and what
they produce is small; a large log was written by a program, and is left as it is (and costs nothing more to
read). A continuation is appended to the line it continues and its own line is left empty, so every line
keeps its number in the source: the report's line numbers are those of the log the user has.

A line continues the one before it when they carry the same rank prefix (or none) and:

- the one before is exactly as long as the terminal (the longest length in the log, shared by several
  lines: where a terminal cuts) and this one does not start a record of its own;
- or the one before ends inside a word and this one starts with the rest of it, and the word so made is one
  the log uses elsewhere or one of the knowledge base's own words (`Timeo` + `ut(ms)` is `Timeout`,
  `l` + `ine 2555` is `line`);
- or the one before is long and ends with a word, and this one starts with one space and a lowercase word
  (a hand-wrapped sentence: `... you can` / ` check NCCL warnings`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator

from .lines import split_rank, strip_ansi

MIN_WIDTH = 70  # narrower "terminals" are coincidences of short lines
MIN_CUT_LINES = 2  # lines cut at the same width before it counts as the terminal's width
HAND_WRAP_MIN = 60
_WORD = re.compile(r"[A-Za-z]{3,}")
_TAIL_WORD = re.compile(r"([A-Za-z_]+)$")
_HEAD_WORD = re.compile(r"^([a-z_]+)")
# what starts a record of its own: a traceback, an exception, a log record with a level or a time,
# an indented frame, a launcher banner
_RECORD_START = re.compile(
    r"^(?:\s{2,}|Traceback|During handling|The above exception|[\w.]*(?:Error|Exception|Warning)\b|"
    r"\[?[EWIDF]\d{4}|\d{4}-\d\d-\d\d|\d\d:\d\d|(?:INFO|WARNING|ERROR|DEBUG)\b|\[|frame #|usage:|"
    r"[\w.-]+\.py:\s|torch\.|ncclInvalid|nccl[A-Z])"
)


# box-drawing characters, and a rule of one repeated character: drawn at a width, not cut at it
_DRAWN = re.compile(r"[\u2500-\u257f]|^\s*([=\-_*#~])\1{9,}\s*$")


def vocabulary(patterns: Iterable[str]) -> frozenset[str]:
    """The words (3+ letters) written literally in the knowledge base's patterns, lower-cased."""
    return frozenset(word.lower() for pattern in patterns for word in _WORD.findall(pattern))


def unwrap(blocks: Iterator[tuple[str, bool]], known_words: frozenset[str]) -> Iterator[tuple[str, bool]]:
    """The blocks of one log, the log rejoined (see the module's docstring) when it is a single block."""
    first = next(blocks, None)
    if first is None:
        return
    text, last = first
    if last:
        yield join_lines(text, known_words), True
        return
    yield first
    yield from blocks


def join_lines(text: str, known_words: frozenset[str] = frozenset()) -> str:
    """`text` with wrapped lines rejoined; the same number of lines (continuations become empty)."""
    lines = text.split("\n")
    if len(lines) < 2:
        return text
    plain = [strip_ansi(line).rstrip("\r") for line in lines]
    width = _terminal_width(plain)
    log_words = {w.lower() for w in _WORD.findall(text)} if len(text) < (1 << 20) else set()
    words = known_words | log_words
    out = list(plain)
    target = 0  # the line continuations are appended to
    for i in range(1, len(plain)):
        if not plain[i]:
            target = i  # an empty line ends a message
            continue
        prev_rank, prev_text = split_rank(out[target])
        rank, cur_text = split_rank(plain[i])
        # a continuation repeats the prefix (torchrun) or has none (a terminal cut the prefixed line)
        same = rank == prev_rank or rank is None
        if same and prev_text and _continues(plain[i - 1], prev_text, cur_text, width, words, known_words):
            out[target] += cur_text
            out[i] = ""
        else:
            target = i
    return "\n".join(out)


def _terminal_width(lines: list[str]) -> int | None:
    """The width a terminal cut lines at: the longest length, when several lines have exactly it."""
    lengths = Counter(len(line) for line in lines if len(line) >= MIN_WIDTH)
    if not lengths:
        return None
    longest = max(lengths)
    return longest if lengths[longest] >= MIN_CUT_LINES else None


def _continues(
    raw_prev: str, prev: str, cur: str, width: int | None, words: set[str] | frozenset[str],
    known_words: frozenset[str],
) -> bool:
    if _DRAWN.search(prev) or _DRAWN.search(cur):
        return False  # a box or a rule drawn at a fixed width (rich's tracebacks, torchrun's summary)
    if width is not None and len(raw_prev) == width and not _RECORD_START.match(cur):
        return True
    tail, head = _TAIL_WORD.search(prev), _HEAD_WORD.match(cur)
    if tail and head and not _RECORD_START.match(cur):
        joined = (tail.group(1) + head.group(1)).lower()
        # (the cut half is a "word" of the log only because of the cut: only the knowledge base's count)
        if joined in words and tail.group(1).lower() not in known_words | {"a", "an", "i"}:
            return True
    return (
        len(prev) >= HAND_WRAP_MIN and prev[-1:].isalpha() and cur.startswith(" ")
        and cur[1:2].islower() and not cur.startswith("  ")
    )
