"""F11 sharded-step-divergence: ranks that ran a different number of forward passes of a sharded model.

Every forward (and backward) of an FSDP / `fully_shard` model is a series of all-gathers and
reduce-scatters issued inside the library, so the collective a stuck rank waits in names no user line,
and the mismatch the judge finds (an `all_gather_single` against a peer's `barrier`) is a consequence. The
fact that explains it is the count of forward passes of the sharded root on each rank, which every rank
publishes with its stack (`RankRecord.passes`). Pure: `pass_difference` reads the records, and
`verdict.decide` re-tells its verdict with the counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..model import Frame, ModelPasses, RankRecord
from .places import short_path
from .rank_branch import rank_branch

SLUG = "sharded-step-divergence"
SHARDED = ("fully_shard", "FullyShardedDataParallel")


@dataclass(frozen=True)
class PassDifference:
    """Per rank, its passes of the one sharded root whose counts differ (most passes first)."""

    passes: Mapping[int, ModelPasses]
    branched: tuple[int, str] | None = None  # a rank whose last pass is under a rank test, and that test

    @property
    def headline(self) -> str:
        order = sorted(self.passes, key=lambda r: (-self.passes[r].forwards, r))
        name = self.passes[order[0]].name
        parts = []
        for index, rank in enumerate(order):
            passes = self.passes[rank]
            plural = "es" if passes.forwards != 1 else ""
            noun = f" forward pass{plural} of the sharded `{name}`" if index == 0 else ""
            at = ""
            if passes.path and passes.line:
                at = f" (the last at {short_path(passes.path)}:{passes.line})"
            parts.append(f"rank {rank} ran {passes.forwards}{noun}{at}")
        text = ", ".join(parts)
        return (text + ": every forward of a sharded model is a series of all-gathers, so every rank must "
                "run the same number")

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.passes))


def pass_difference(records: Mapping[int, RankRecord]) -> PassDifference | None:
    """The sharded root whose forward counts differ between the ranks that published them, or None."""
    by_name: dict[str, dict[int, ModelPasses]] = {}
    for rank, record in records.items():
        for passes in record.passes:
            if passes.wrapper in SHARDED:
                by_name.setdefault(passes.name, {})[rank] = passes
    for ranks in by_name.values():
        if len(ranks) > 1 and len({p.forwards for p in ranks.values()}) > 1:
            most = max(ranks, key=lambda r: (ranks[r].forwards, -r))
            return PassDifference(ranks, _branch_of(ranks[most], most))
    return None


def _branch_of(passes: ModelPasses, rank: int) -> tuple[int, str] | None:
    """Whether the last pass of the rank that ran more is a call under a rank-conditional branch."""
    if passes.path is None or passes.line is None:
        return None
    branch = rank_branch((Frame(passes.path, passes.line, "", None),))
    return (rank, branch.describe()) if branch is not None else None
