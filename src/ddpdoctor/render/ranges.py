"""Rank lists as ranges, for messages and tables of large jobs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


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
