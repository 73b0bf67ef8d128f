"""Find candidate lines fast: every signature starts with literal text, searched with `str.find`'s speed.

Python's `re` has no fast path for an alternation of many patterns (one combined regex runs at a few
MB/s), but a single pattern that starts with a literal is searched with a fast substring scan. So each
pattern is reduced to the literal text each of its top-level alternatives starts with (its anchors); a
block of the log is searched for the anchors, and only the patterns whose anchors occur in the block are
run over it. The knowledge-base loader insists on anchors of at least MIN_ANCHOR characters, which is what
keeps `explain` streaming at tens of MB/s whatever the knowledge base grows into.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

MIN_ANCHOR = 4
_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>")
_SPECIAL = set(".^$*+?{}[]()|\\")
_QUANTIFIERS = set("?*{")


def _branches(pattern: str) -> list[str]:
    """The top-level alternatives of a regex (splits at `|` outside groups and classes)."""
    out, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    out.append(pattern[start:])
    return out


def _literal_prefix(branch: str) -> str:
    literal: list[str] = []
    i = 0
    while i < len(branch):
        ch = branch[i]
        if ch == "\\":
            escape = branch[i + 1 : i + 2]
            if escape == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", branch[i + 2 : i + 4]):
                char, width = chr(int(branch[i + 2 : i + 4], 16)), 4
            elif escape and not escape.isalnum():
                char, width = escape, 2
            else:
                break  # \d, \w, \s, \b, ...
        elif ch in _SPECIAL:
            break
        else:
            char, width = ch, 1
        if branch[i + width : i + width + 1] in _QUANTIFIERS and branch[i + width : i + width + 1]:
            break  # `x?` / `x*` / `x{0,2}`: this character is optional
        literal.append(char)
        i += width
        if branch[i : i + 1] == "+":
            break
    return "".join(literal)


def anchors(pattern: str) -> list[str] | None:
    """The literal text each alternative of `pattern` starts with, or None if one has too little."""
    found = [_literal_prefix(branch) for branch in _branches(pattern)]
    if any(len(a) < MIN_ANCHOR for a in found):
        return None
    return found


class Trigger:
    """All the patterns whose lines `explain` wants, searched as one."""

    def __init__(self, patterns: Iterable[re.Pattern[str]]):
        self.entries: list[tuple[tuple[str, ...], re.Pattern[str]]] = []
        self.origin: dict[re.Pattern[str], str] = {}  # searched pattern -> the pattern as written
        for pattern in patterns:
            found = anchors(pattern.pattern)
            if found is None:
                raise ValueError(
                    f"pattern does not start with {MIN_ANCHOR}+ literal characters: {pattern.pattern!r}"
                )
            # named groups would make no difference to finding lines; dropping them lets patterns be shared
            searched = re.compile(_NAMED_GROUP.sub("(?:", pattern.pattern))
            self.entries.append((tuple(found), searched))
            self.origin[searched] = pattern.pattern

    def finditer(self, text: str, start: int = 0, end: int | None = None) -> Iterator[re.Match[str]]:
        """Matches of any pattern in text[start:end], in order of position."""
        end = len(text) if end is None else end
        present: dict[str, bool] = {}  # patterns share anchors ("Connection ", "exitcode"): look once
        matches: list[re.Match[str]] = []
        for found, pattern in self.entries:
            hit = False
            for anchor in found:
                if anchor not in present:
                    present[anchor] = anchor in text
                if present[anchor]:
                    hit = True
                    break
            if hit:
                matches.extend(pattern.finditer(text, start, end))
        matches.sort(key=lambda m: m.start())
        return iter(matches)

    def search(self, text: str) -> re.Match[str] | None:
        return next(self.finditer(text), None)
