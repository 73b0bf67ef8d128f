"""F11 sharded-step-divergence: ranks that ran a different number of forward passes of a sharded model.

Every forward (and backward) of an FSDP / `fully_shard` model is a series of all-gathers and
reduce-scatters issued inside the library, so the collective a stuck rank waits in names no user line,
and the mismatch the judge finds (an `all_gather_single` against a peer's `barrier`) is a consequence. The
fact that explains it is the count of forward (or backward) passes of the sharded root on each rank, which
every rank publishes with its heartbeat (`RankRecord.passes`). Pure: `pass_difference` reads the records, and
`verdict.decide` re-tells its verdict with the counts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from ...records import Frame, ModelPasses, RankRecord
from ...render.paths import short_path
from .rank_branch import rank_branch

SLUG = "sharded-step-divergence"
SHARDED = ("fully_shard", "FullyShardedDataParallel")


class Passes(str, enum.Enum):
    """Which passes of the sharded root the ranks ran a different number of."""

    FORWARD = "forward"
    BACKWARD = "backward"

    @property
    def advice(self) -> str | None:
        """The key of the class's `[guard.advice]` that fits (None: its default)."""
        return "skipped-backward" if self is Passes.BACKWARD else None


@dataclass(frozen=True)
class PassDifference:
    """Per rank, its passes of the one sharded root whose counts differ (most passes first), and which
    count tells the divergence (`kind`)."""

    passes: Mapping[int, ModelPasses]
    branched: tuple[int, str] | None = None  # a rank whose last pass is under a rank test, and that test
    kind: Passes = Passes.FORWARD

    def _count(self, rank: int) -> int:
        passes = self.passes[rank]
        return passes.forwards if self.kind is Passes.FORWARD else passes.backwards

    def _site(self, rank: int) -> tuple[str | None, int | None]:
        passes = self.passes[rank]
        if self.kind is Passes.FORWARD:
            return passes.path, passes.line
        return passes.backward_path, passes.backward_line

    @property
    def headline(self) -> str:
        order = sorted(self.passes, key=lambda r: (-self._count(r), r))
        name = self.passes[order[0]].name
        parts = []
        for index, rank in enumerate(order):
            count = self._count(rank)
            plural = "es" if count != 1 else ""
            noun = f" {self.kind.value} pass{plural} of the sharded `{name}`" if index == 0 else ""
            path, line = self._site(rank)
            at = f" (the last at {short_path(path)}:{line})" if path and line else ""
            parts.append(f"rank {rank} ran {count}{noun}{at}")
        text = ", ".join(parts)
        if self.kind is Passes.FORWARD:
            return (text + ": every forward of a sharded model is a series of all-gathers, so every rank "
                    "must run the same number")
        forwards = ""
        if len({p.forwards for p in self.passes.values()}) > 1:
            forwards = " (forward passes: " + ", ".join(
                f"rank {r} {self.passes[r].forwards}" for r in order) + ")"
        return (text + forwards + ": every backward of a sharded model is a series of reduce-scatters (and "
                "all-gathers of what the forward resharded), so a rank that skips one leaves the others "
                "waiting in it")

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.passes))


def pass_difference(records: Mapping[int, RankRecord]) -> PassDifference | None:
    """The sharded root whose forward or backward counts differ between the ranks that published them, or
    None. Backward counts tell it when they differ and the forward counts agree, or differ the other way
    (the rank that skipped a backward went on to the next forward: one forward more, one backward less);
    otherwise the forward counts do."""
    by_name: dict[str, dict[int, ModelPasses]] = {}
    for rank, record in records.items():
        for passes in record.passes:
            if passes.wrapper in SHARDED:
                by_name.setdefault(passes.name, {})[rank] = passes
    for ranks in by_name.values():
        if len(ranks) < 2:
            continue
        kind = _telling(ranks)
        if kind is None:
            continue
        if kind is Passes.BACKWARD:
            most = max(ranks, key=lambda r: (ranks[r].backwards, -r))
            site = ranks[most].backward_path, ranks[most].backward_line
        else:
            most = max(ranks, key=lambda r: (ranks[r].forwards, -r))
            site = ranks[most].path, ranks[most].line
        return PassDifference(ranks, _branch_at(site, most), kind)
    return None


def _telling(ranks: Mapping[int, ModelPasses]) -> Passes | None:
    forwards = {r: p.forwards for r, p in ranks.items()}
    backwards = {r: p.backwards for r, p in ranks.items()}
    if len(set(backwards.values())) > 1:
        if len(set(forwards.values())) == 1:
            return Passes.BACKWARD
        fewest_backwards = min(backwards, key=lambda r: (backwards[r], r))
        if forwards[fewest_backwards] == max(forwards.values()):
            return Passes.BACKWARD
    if len(set(forwards.values())) > 1:
        return Passes.FORWARD
    return None


def _branch_at(site: tuple[str | None, int | None], rank: int) -> tuple[int, str] | None:
    """Whether the last pass of the rank that ran more is a call under a rank-conditional branch."""
    path, line = site
    if path is None or line is None:
        return None
    branch = rank_branch((Frame(path, line, "", None),))
    return (rank, branch.describe()) if branch is not None else None
