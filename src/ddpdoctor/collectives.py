"""The one vocabulary of `torch.distributed`'s collectives and point-to-point ops.

Every part of ddpdoctor that needs to know the ops derives from this table: the checker (which calls are
collectives, where their tensor arguments are), the guard (which functions it wraps, which arguments a
fingerprint records, which ops pair with one peer), and explain (the names torch and NCCL print for them).
It is data only: no torch import, so the checker and explain work without torch installed.

Signatures as in `torch.distributed.distributed_c10d` (torch 2.13); the `OpType` names are those of
c10d's `OpType` enum that a `WorkNCCL(... OpType=...)` watchdog line or a `CollectiveFingerPrint(...
OpType=...)` mismatch prints for the op (an op built from others, like `all_gather_object`, prints theirs).
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Kind(enum.Enum):
    """What an op does with the group."""

    REDUCE = "reduce"
    """Combines every rank's tensor with a reduce op (`all_reduce`, `reduce`)."""
    GATHER = "gather"
    """Collects every rank's piece (`all_gather*`, `gather*`)."""
    REDUCE_SCATTER = "reduce_scatter"
    """Reduces, then hands each rank its piece (`reduce_scatter*`)."""
    BROADCAST = "broadcast"
    """Copies the root's data to every rank (`broadcast*`)."""
    SCATTER = "scatter"
    """Hands each rank its piece of the root's list (`scatter*`)."""
    ALL_TO_ALL = "all_to_all"
    """Every rank sends a piece to every other (`all_to_all*`)."""
    BARRIER = "barrier"
    """Carries no data: waits for every rank (`barrier`, `monitored_barrier`)."""
    POINT_TO_POINT = "point_to_point"
    """Pairs with one peer, not with the whole group (`send`, `recv`, ...)."""
    GROUP = "group"
    """Makes a process group; every rank of the world must call it, in the same order (`new_group`)."""


class Role(enum.Enum):
    """What an op does with one of its tensor arguments."""

    IN = "in"
    """Read only."""
    OUT = "out"
    """Written only."""
    UNLABELLED = ""
    """Read and written in place (`all_reduce`'s tensor), a point-to-point buffer, or a root's own list
    (`gather_list`): reports leave it unlabelled."""


class TensorParam(NamedTuple):
    name: str
    position: int
    """Its position in the op's signature (a call may pass it positionally)."""
    role: Role
    is_list: bool
    """A list of tensors (`tensor_list`, `scatter_list`) rather than one tensor."""
    shapes_agree: bool
    """Every rank passes the same shape. False for a rank's own piece (all_gather's `tensor`, sized as this
    rank's entry of the output list; NCCL takes uneven pieces) and a root-only list (`gather_list`)."""


class Collective(NamedTuple):
    name: str
    kind: Kind
    tensors: tuple[TensorParam, ...]
    """In the order a fingerprint lists their shapes."""
    roots: tuple[str, ...] = ()
    """Parameters naming the root (`src`, `dst`) or the peer; `group_src` / `group_dst` are group ranks."""
    root_zero_by_default: bool = False
    """torch sets the root to global rank 0 when the call names none (`gather`, `broadcast_object_list`)."""
    objects: bool = False
    """Moves pickled Python objects (through tensors on the device the group's backend uses)."""
    shapes_agree: bool = True
    """The ranks' shapes must agree; False where each rank sends its own split sizes (`all_to_all*`)."""
    sequence_uneven: bool = False
    """Advances the group's sequence number differently on different ranks: gloo counts a send or recv
    only on its two ranks, and builds `monitored_barrier` from them."""
    op_types: tuple[str, ...] = ()
    """The c10d `OpType` names printed for it."""

    @property
    def p2p(self) -> bool:
        return self.kind is Kind.POINT_TO_POINT

    def tensor(self, name: str) -> TensorParam | None:
        return next((t for t in self.tensors if t.name == name), None)


def _t(name: str, position: int, role: Role = Role.UNLABELLED, *, is_list: bool = False,
       shapes_agree: bool = True) -> TensorParam:
    return TensorParam(name, position, role, is_list, shapes_agree)


_IN, _OUT = Role.IN, Role.OUT
# The pair of whole tensors of the `*_base` / `*_tensor` / `*_single` forms.
_GATHERED = (_t("output_tensor", 0, _OUT), _t("input_tensor", 1, _IN))
_SCATTERED = (_t("output", 0, _OUT), _t("input", 1, _IN))
_SRC = ("src", "group_src")
_DST = ("dst", "group_dst")

TORCH_DISTRIBUTED: tuple[Collective, ...] = (
    Collective("all_reduce", Kind.REDUCE, (_t("tensor", 0),), op_types=("ALLREDUCE",)),
    Collective("all_reduce_coalesced", Kind.REDUCE, (_t("tensors", 0, is_list=True),),
               op_types=("ALLREDUCE_COALESCED", "COALESCED")),
    Collective("reduce", Kind.REDUCE, (_t("tensor", 0),), roots=_DST, op_types=("REDUCE",)),
    Collective(
        "all_gather", Kind.GATHER,
        (_t("tensor", 1, shapes_agree=False), _t("tensor_list", 0, _OUT, is_list=True)),
        op_types=("ALLGATHER",),
    ),
    Collective("all_gather_into_tensor", Kind.GATHER, _GATHERED,
               op_types=("_ALLGATHER_BASE",)),
    Collective("all_gather_single", Kind.GATHER, _GATHERED,
               op_types=("_ALLGATHER_BASE",)),
    Collective("_all_gather_base", Kind.GATHER, _GATHERED,
               op_types=("_ALLGATHER_BASE",)),
    Collective(
        "all_gather_coalesced", Kind.GATHER,
        (_t("input_tensor_list", 1, _IN, is_list=True), _t("output_tensor_lists", 0, _OUT, is_list=True)),
        op_types=("ALLGATHER_COALESCED", "COALESCED"),
    ),
    Collective("all_gather_object", Kind.GATHER, (), objects=True, op_types=("ALLGATHER",)),
    Collective("gather", Kind.GATHER,
               (_t("tensor", 0, _IN), _t("gather_list", 1, is_list=True, shapes_agree=False)),
               roots=_DST, root_zero_by_default=True, op_types=("GATHER",)),
    Collective("gather_object", Kind.GATHER, (), roots=_DST, root_zero_by_default=True, objects=True,
               op_types=("ALLGATHER", "GATHER")),
    Collective(
        "reduce_scatter", Kind.REDUCE_SCATTER,
        (_t("output", 0, _OUT, shapes_agree=False), _t("input_list", 1, _IN, is_list=True)),
        op_types=("REDUCE_SCATTER",),
    ),
    Collective("reduce_scatter_tensor", Kind.REDUCE_SCATTER, _SCATTERED,
               op_types=("_REDUCE_SCATTER_BASE",)),
    Collective("reduce_scatter_single", Kind.REDUCE_SCATTER, _SCATTERED,
               op_types=("_REDUCE_SCATTER_BASE",)),
    Collective("_reduce_scatter_base", Kind.REDUCE_SCATTER, _SCATTERED,
               op_types=("_REDUCE_SCATTER_BASE",)),
    Collective("broadcast", Kind.BROADCAST, (_t("tensor", 0),), roots=_SRC, op_types=("BROADCAST",)),
    Collective("broadcast_object_list", Kind.BROADCAST, (), roots=_SRC, root_zero_by_default=True,
               objects=True, op_types=("BROADCAST",)),
    Collective("scatter", Kind.SCATTER,
               (_t("tensor", 0, _OUT), _t("scatter_list", 1, is_list=True, shapes_agree=False)),
               roots=_SRC, root_zero_by_default=True, op_types=("SCATTER",)),
    Collective("scatter_object_list", Kind.SCATTER, (), roots=_SRC, root_zero_by_default=True, objects=True,
               op_types=("SCATTER",)),
    Collective(
        "all_to_all", Kind.ALL_TO_ALL,
        (_t("output_tensor_list", 0, _OUT, is_list=True), _t("input_tensor_list", 1, _IN, is_list=True)),
        shapes_agree=False, op_types=("ALLTOALL",),
    ),
    Collective("all_to_all_single", Kind.ALL_TO_ALL, _SCATTERED,
               shapes_agree=False, op_types=("ALLTOALL_BASE",)),
    Collective("barrier", Kind.BARRIER, (), op_types=("BARRIER",)),
    # gloo only, built from sends and receives: it prints theirs.
    Collective("monitored_barrier", Kind.BARRIER, (), sequence_uneven=True, op_types=("SEND", "RECV")),
    Collective("send", Kind.POINT_TO_POINT, (_t("tensor", 0),), roots=_DST, sequence_uneven=True,
               op_types=("SEND",)),
    Collective("recv", Kind.POINT_TO_POINT, (_t("tensor", 0),), roots=_SRC, sequence_uneven=True,
               op_types=("RECV", "RECVANYSOURCE")),
    Collective("isend", Kind.POINT_TO_POINT, (_t("tensor", 0),), roots=_DST, sequence_uneven=True,
               op_types=("SEND",)),
    Collective("irecv", Kind.POINT_TO_POINT, (_t("tensor", 0),), roots=_SRC, sequence_uneven=True,
               op_types=("RECV", "RECVANYSOURCE")),
    Collective("batch_isend_irecv", Kind.POINT_TO_POINT, (), sequence_uneven=True,
               op_types=("SEND", "RECV", "COALESCED")),
    Collective("send_object_list", Kind.POINT_TO_POINT, (), roots=_DST, objects=True, sequence_uneven=True,
               op_types=("SEND",)),
    Collective("recv_object_list", Kind.POINT_TO_POINT, (), roots=_SRC, objects=True, sequence_uneven=True,
               op_types=("RECV",)),
    # Group creation: collective over the store (every rank of the world calls it, in the same order), no
    # tensors, and no OpType of its own.
    Collective("init_process_group", Kind.GROUP, ()),
    Collective("new_group", Kind.GROUP, ()),
    Collective("new_subgroups", Kind.GROUP, ()),
)

BY_NAME: dict[str, Collective] = {op.name: op for op in TORCH_DISTRIBUTED}


def by_op_type(op_type: str) -> tuple[Collective, ...]:
    """The ops that print this c10d `OpType` name (`_ALLGATHER_BASE` → `all_gather_into_tensor`, ...)."""
    return tuple(op for op in TORCH_DISTRIBUTED if op_type in op.op_types)
