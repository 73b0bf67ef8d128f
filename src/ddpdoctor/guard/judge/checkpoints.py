"""A checkpoint of a rank's chain of completed collectives (rank/consensus.py publishes them) as the judge
compares it with another rank's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...records import CallRecord, calls_from_json
from ..fingerprint import differences


@dataclass(frozen=True)
class Checkpoint:
    """One rank's checkpoint of a group's chain, as published: JSON `{"rank", "h", "fps": [calls]}`."""

    rank: int
    digest: str
    calls: tuple[CallRecord, ...]  # the segment's, oldest first

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Checkpoint:
        return cls(int(data.get("rank", -1)), str(data.get("h", "")), calls_from_json(data.get("fps") or ()))


def first_difference(ours: Checkpoint, theirs: Checkpoint) -> tuple[CallRecord, CallRecord] | None:
    """The first pair of calls (same position in the segment) whose compared fields differ."""
    for a, b in zip(ours.calls, theirs.calls, strict=False):
        if differences(a, b):
            return a, b
    return None
