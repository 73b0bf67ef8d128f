"""The process groups a rank's collectives run on, as the hot path needs them: name, backend devices,
sequence number, and the share of that number that point-to-point ops took."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...failsafe import attempt
from ..fingerprint import CollectiveFingerprint


def reduce_op_name(op: Any) -> str:
    """The name of a ReduceOp *object*: `dist.ReduceOp(dist.ReduceOp.AVG)`, or the PREMUL_SUM that FSDP
    builds with a divide factor. Its str() carries its address, which differs on every rank. (The enum
    members, `dist.ReduceOp.SUM`, have a `.name` and never get here.)"""
    name = getattr(getattr(op, "op", None), "name", None)
    if name:
        return str(name)
    text = str(op)
    if " object at 0x" in text:
        return type(op).__name__
    return text.rsplit(".", 1)[-1]


def _backend_name(group: Any) -> str:
    import torch.distributed as dist

    return str(dist.get_backend(group))


class GroupInfo:
    __slots__ = (
        "group",
        "name",
        "device_types",
        "devices_ok",
        "backend",
        "sequence",
        "member",
        "offset",
        "renumber_from",
        "global_ranks",
    )

    def __init__(self, group: Any) -> None:
        self.group = group
        # This rank's share of the sequence number that came from fingerprint.RENUMBERED_OPS ops, and the raw
        # number
        # when one of them is in progress (the monitor publishes that while it runs).
        self.offset = 0
        self.renumber_from: int | None = None
        # torch passes a placeholder object for groups this rank is not in; the call is then a no-op
        self.member = hasattr(group, "_get_sequence_number_for_group")
        self.name = attempt("GroupInfo: the group's name", lambda: str(group.group_name), str(id(group)))
        # unknown backend: do not judge devices
        self.device_types: frozenset[str] = attempt(
            "GroupInfo: the group's device types",
            lambda: frozenset(d.type for d in group._device_types),
            frozenset(),
        )
        # Devices already found to have a backend here: `device in set` costs a tenth of `device.type`,
        # which builds a new string on every call.
        self.devices_ok: set = set()
        self.backend = attempt("GroupInfo: the group's backend", lambda: _backend_name(group), "?")
        self.global_ranks: list[int] | None = None  # read at the first group_src= / group_dst=
        sequence = getattr(group, "_get_sequence_number_for_group", None)
        # backends without sequence numbers
        if sequence is not None and attempt("GroupInfo: the group's sequence number", sequence, None) is None:
            sequence = None
        self.sequence = sequence

    def global_rank(self, group_rank: int) -> int:
        """The global rank of a group rank (fingerprints name every root by its global rank, as `src=`
        does)."""
        if self.global_ranks is None:
            import torch.distributed as dist

            self.global_ranks = list(dist.get_process_group_ranks(self.group))
        if 0 <= group_rank < len(self.global_ranks):
            return self.global_ranks[group_rank]
        return group_rank  # out of range: torch raises its own error for it

    def renumbered(self, op: str) -> None:
        """Take the increments of the point-to-point op (or monitored_barrier) that just returned out of
        this rank's numbering; a monitored_barrier keeps one number, as the collective it is."""
        start = self.renumber_from
        if start is not None and self.sequence is not None:
            self.offset += self.sequence() - start - (1 if op == "monitored_barrier" else 0)
        self.renumber_from = None


def sequence_numbers(groups: Iterable[GroupInfo]) -> dict[str, int]:
    """Each group's sequence number now, C++-issued collectives included."""
    out = {}
    for info in list(groups):
        if info.sequence:
            start = info.renumber_from  # read first: it is cleared after the offset is updated
            out[info.name] = (start if start is not None else info.sequence()) - info.offset
    return out


def never_issued(groups: Iterable[GroupInfo], fp: CollectiveFingerprint) -> bool:
    """Whether a call that raised left its group's sequence number where it found it: the backend
    refused it locally, and no peer waits for it."""
    if fp.seq < 0:
        return False
    for info in list(groups):
        if info.name == fp.signature.group and info.sequence is not None:
            number = attempt("runtime: the sequence number of an aborted group", info.sequence, None)
            return number is not None and number - info.offset == fp.seq
    return False
