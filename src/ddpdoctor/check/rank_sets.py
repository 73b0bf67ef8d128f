"""The rank lattice: which processes of a distributed run take a branch (`RankSet`), how `and`, `or` and
`not` combine them (`meet`, `join`, `RankTest.negated`), and the tests every rank or no rank passes."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.Enum):
    """What a rank-holding value counts."""

    GLOBAL = "global rank"
    LOCAL = "local rank"  # the process's index on its node (its GPU)
    NODE = "node rank"  # the node's index: the same for every process of a node
    # the index in a named process group (`tp_group.rank()`, `dist.get_rank(group=tp)`): a global rank to
    # the lattice, but its sets are `subgroup` ones
    GROUP = "rank in a process group"


class Ranks(enum.Enum):
    """The processes that take a branch, in a distributed run."""

    NONE = "no process of a distributed run"  # the branch a single-process run takes
    RANK_ZERO = "global rank 0"
    ONE_RANK = "one rank"
    ONE_PER_NODE = "one process per node"
    NODE = "every process of one node"
    SOME = "some ranks"
    ALL = "every rank"


@dataclass(frozen=True)
class RankSet:
    kind: Ranks
    # The global ranks in the set, where the test names them (`rank in (0, 1)`, `rank < 2`).
    members: frozenset[int] | None = None
    # Chosen by ranks in named process groups only: in a grid of groups the same on every member of another
    # group (subgroups.py)
    subgroup: bool = False

    @property
    def restricted(self) -> bool:
        """Some ranks of a distributed run take it, but not all: the others skip what it holds."""
        return self.kind not in (Ranks.ALL, Ranks.NONE)

    @property
    def one_writer_per_node(self) -> bool:
        """At most one process per node (per local file system) runs under it."""
        return self.kind in (Ranks.NONE, Ranks.RANK_ZERO, Ranks.ONE_RANK, Ranks.ONE_PER_NODE)

    def covers(self, members: frozenset[int]) -> bool:
        """Every one of `members` is in this set (a group's collective reached by the whole group)."""
        if self.kind == Ranks.ALL:
            return True
        return self.members is not None and members <= self.members


ALL = RankSet(Ranks.ALL)
NONE = RankSet(Ranks.NONE, frozenset())
SOME = RankSet(Ranks.SOME)
RANK_ZERO = RankSet(Ranks.RANK_ZERO, frozenset({0}))


def meet(a: RankSet, b: RankSet) -> RankSet:
    """The processes in both (`a and b`): never more writers than either."""
    if a.kind == Ranks.ALL:
        return b
    if b.kind == Ranks.ALL:
        return a
    members = a.members & b.members if a.members is not None and b.members is not None else (
        a.members if a.members is not None else b.members)
    kinds = {a.kind, b.kind}
    if Ranks.NONE in kinds:
        kind = Ranks.NONE
    elif a.kind == b.kind:
        kind = a.kind
    elif Ranks.RANK_ZERO in kinds:
        kind = Ranks.RANK_ZERO
    elif Ranks.ONE_RANK in kinds:
        kind = Ranks.ONE_RANK
    elif kinds == {Ranks.ONE_PER_NODE, Ranks.NODE}:
        kind = Ranks.ONE_RANK  # the local rank 0 of one node
    elif Ranks.ONE_PER_NODE in kinds:
        kind = Ranks.ONE_PER_NODE
    else:
        kind = Ranks.SOME
    return RankSet(kind, members, a.subgroup and b.subgroup)


def join(a: RankSet, b: RankSet) -> RankSet:
    """The processes in either (`a or b`)."""
    if a.kind == Ranks.NONE:
        return b
    if b.kind == Ranks.NONE:
        return a
    members = a.members | b.members if a.members is not None and b.members is not None else None
    kinds = {a.kind, b.kind}
    if Ranks.ALL in kinds:
        return ALL
    if a.kind == b.kind and a.kind != Ranks.ONE_RANK:
        kind = a.kind
    elif kinds == {Ranks.RANK_ZERO, Ranks.ONE_PER_NODE}:
        kind = Ranks.ONE_PER_NODE  # rank 0 is local rank 0 of its node
    elif kinds == {Ranks.RANK_ZERO, Ranks.NODE}:
        kind = Ranks.NODE
    else:
        kind = Ranks.SOME
    return RankSet(kind, members, a.subgroup and b.subgroup)


@dataclass(frozen=True)
class RankTest:
    """Who takes the body (`then`) and who takes the else-branch (`orelse`) of a test."""

    then: RankSet
    orelse: RankSet

    @property
    def is_rank_test(self) -> bool:
        return self.then.restricted or self.orelse.restricted

    def negated(self) -> RankTest:
        return RankTest(self.orelse, self.then)


UNIFORM = RankTest(ALL, ALL)
# True only in a run that is not distributed: `not dist.is_initialized()`, `world_size == 1`.
DISTRIBUTED = RankTest(ALL, NONE)

# Compatibility view for callers that only need "is each side restricted?".
Polarity = tuple[bool, bool]
NOT_RANK: Polarity = (False, False)

