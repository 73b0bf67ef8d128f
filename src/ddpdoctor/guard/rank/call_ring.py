"""The calls this rank issued from Python, by index, in one preallocated ring: the hot path stores each call
in slot `index & MASK` and then publishes the index (two stores, no call); the monitor thread reads it
twice over: the last few calls for its records and reports (`recent`), and every call since its last
heartbeat for the cross-rank hash chain (consensus.ChainCheck.fold).

Why one ring: the hot path used to append each call to two deques (the history and the chain's queue),
two method calls at a few hundred nanoseconds each once a collective has left the caches cold. A slot store
is a bytecode. Readers check each slot's index, so a slot overwritten by a newer call (more than `SLOTS`
calls between two heartbeats) is never taken for an older one.
"""

from __future__ import annotations

from ..fingerprint import CollectiveFingerprint

# Calls written between two folds of the chain before the oldest unfolded ones are overwritten (the chain
# then stops comparing): at a heartbeat of 0.5 s, over 100,000 collectives a second.
SLOTS = 1 << 16
MASK = SLOTS - 1


class CallRing:
    """`slots[index & MASK]` holds the call numbered `index` (from 1), `count` the newest index written.
    Written by the calling threads (under the GIL, the index claimed and the slot and count stored with no
    eval-breaker check in between), read by the monitor."""

    __slots__ = ("slots", "count", "start", "keep")

    def __init__(self, keep: int) -> None:
        self.slots: list[CollectiveFingerprint | None] = [None] * SLOTS
        self.count = 0
        self.start = 0  # calls up to this index belong to an earlier default group (`clear`)
        # The history's length (GuardConfig.ring_size). Older calls are let go once the chain has folded
        # them (consensus.ChainCheck.fold).
        self.keep = max(1, min(keep, SLOTS))

    def at(self, index: int) -> CollectiveFingerprint | None:
        """The call numbered `index`, or None if its slot holds another (or none)."""
        fp = self.slots[index & MASK]
        return fp if fp is not None and fp.index == index else None

    def recent(self) -> list[CollectiveFingerprint]:
        """The last `keep` calls since the group began, oldest first."""
        newest = self.count
        found = (self.at(index) for index in range(max(self.start, newest - self.keep) + 1, newest + 1))
        return [fp for fp in found if fp is not None]

    def complete(self) -> bool:
        """Whether `recent()` holds every call since the group began (nothing dropped)."""
        return self.count - self.start < self.keep

    def clear(self) -> None:
        """A new default group: nothing before it is history any more (indices go on)."""
        self.start = self.count
        self.slots[:] = [None] * SLOTS
