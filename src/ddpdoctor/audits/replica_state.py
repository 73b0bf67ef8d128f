"""F12 replica-divergence, the data and the judgement (pure; replicas.py runs it in a rank).

Two things are compared between data-parallel replicas: the *layout* of a model when it is wrapped (each
parameter's name, shape and dtype, in order), and a *digest* of its parameters at the same forward pass
(two numbers per parameter: the sum and the L2 norm; cheap on any device, and any real drift moves them).
Every rank compares its own with rank 0's through the job's store; what differs becomes a `Finding`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..findings import Evidence, Finding, Fix, Location, Severity

SLUG = "replica-divergence"
# Replicas of a DDP model are bitwise equal (the same all-reduced gradients, the same optimizer step); the
# tolerance only keeps a reduction order that differs between devices from being called a drift.
RELATIVE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Layout:
    """A model's parameters as a wrap sees them: names, shapes, dtypes, in registration order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "shapes": [list(s) for s in self.shapes],
            "dtypes": list(self.dtypes),
        }

    @classmethod
    def from_json(cls, data: Any) -> Layout:
        return cls(
            tuple(str(n) for n in data["names"]),
            tuple(tuple(int(d) for d in s) for s in data["shapes"]),
            tuple(str(d) for d in data["dtypes"]),
        )

    def describe(self, index: int) -> str:
        shape = "[" + ", ".join(map(str, self.shapes[index])) + "]"
        return f"{shape} {self.dtypes[index].replace('torch.', '')}"


@dataclass(frozen=True)
class Digest:
    """Per parameter (in `names` order) its sum and norm, taken before forward pass number `forwards`."""

    forwards: int
    names: tuple[str, ...]
    values: tuple[float, ...]  # sum, norm, sum, norm, ...

    def to_json(self) -> dict[str, Any]:
        return {"forwards": self.forwards, "names": list(self.names), "values": list(self.values)}

    @classmethod
    def from_json(cls, data: Any) -> Digest:
        return cls(
            int(data["forwards"]),
            tuple(str(n) for n in data["names"]),
            tuple(float(v) for v in data["values"]),
        )


def layout_difference(mine: Layout, theirs: Layout) -> tuple[int, str] | None:
    """The first parameter whose name, shape or dtype differs (its index, and what differs, in words with
    this rank first), or None if the layouts agree."""
    for index in range(min(len(mine.names), len(theirs.names))):
        if mine.names[index] != theirs.names[index]:
            return index, f"parameter #{index} is `{mine.names[index]}` here, `{theirs.names[index]}` there"
        if (mine.shapes[index], mine.dtypes[index]) != (theirs.shapes[index], theirs.dtypes[index]):
            return index, (
                f"parameter `{mine.names[index]}` (#{index}) is {mine.describe(index)} here, "
                f"{theirs.describe(index)} there"
            )
    if len(mine.names) != len(theirs.names):
        index = min(len(mine.names), len(theirs.names))
        extra = mine if len(mine.names) > len(theirs.names) else theirs
        return index, f"parameter `{extra.names[index]}` (#{index}) exists on one rank only"
    return None


def differing_parameters(mine: Digest, theirs: Digest) -> list[str]:
    """The names of the parameters whose digests differ, in order (empty when they agree, or when the two
    digests are not of the same parameters)."""
    if mine.names != theirs.names or len(mine.values) != len(theirs.values):
        return []
    out = []
    for index, name in enumerate(mine.names):
        pair = mine.values[2 * index : 2 * index + 2], theirs.values[2 * index : 2 * index + 2]
        if any(_differ(a, b) for a, b in zip(*pair, strict=True)):
            out.append(name)
    return out


def _differ(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    return abs(a - b) > RELATIVE_TOLERANCE * max(abs(a), abs(b), 1e-12)


def layout_finding(
    rank: int,
    other: int,
    wrapper: str,
    site: tuple[str, int] | None,
    difference: str,
    counts: tuple[int, int],
) -> Finding:
    """Rank `rank`'s model is not rank `other`'s when `wrapper` wraps it."""
    where = f" ({site[0].rsplit('/', 1)[-1]}:{site[1]})" if site else ""
    sizes = (
        f"rank {rank} has {counts[0]} parameters, rank {other} {counts[1]}; "
        if counts[0] != counts[1]
        else ""
    )
    message = (
        f"rank {rank}'s model is not rank {other}'s when {wrapper} wraps it{where}: {sizes}"
        f"{difference.replace(' here', f' on rank {rank}').replace(' there', f' on rank {other}')}"
    )
    return Finding(
        class_=SLUG,
        message=message,
        severity=Severity.ERROR,
        locations=(Location(site[0], site[1], rank=rank),) if site else (),
        fix=Fix(
            "build the model the same way on every rank before wrapping it: take sizes from the config or "
            "from rank 0 (`dist.broadcast_object_list`), not from each rank's own data; load the same "
            "checkpoint on every rank"
        ),
        evidence=(Evidence(f"rank {rank} vs rank {other} at {wrapper}", rank=rank),),
        facts={"kind": "layout", "ranks": [other, rank], "wrapper": wrapper, "difference": difference},
    )


def digest_finding(
    rank: int,
    other: int,
    wrapper: str,
    site: tuple[str, int] | None,
    when: str,
    differing: Sequence[str],
    total: int,
    advice: str,
) -> Finding:
    """Rank `rank`'s parameters are not rank `other`'s at the same forward pass."""
    first = differing[0]
    more = f" (and {len(differing) - 1} more of {total})" if len(differing) > 1 else ""
    where = f" (wrapped at {site[0].rsplit('/', 1)[-1]}:{site[1]})" if site else ""
    message = (
        f"replicas differ: parameter `{first}`{more} is not the same on rank {rank} as on rank {other} "
        f"{when} of the {wrapper} model{where}: the ranks train different models, and a checkpoint "
        f"holds one rank's"
    )
    return Finding(
        class_=SLUG,
        message=message,
        severity=Severity.WARNING,
        locations=(Location(site[0], site[1], rank=rank),) if site else (),
        fix=Fix(advice) if advice else None,
        evidence=(
            Evidence(
                f"rank {rank} vs rank {other}: {len(differing)} of {total} parameters differ", rank=rank
            ),
        ),
        facts={
            "kind": "digest",
            "ranks": [other, rank],
            "parameter": first,
            "differing": len(differing),
            "parameters": total,
            "when": when,
        },
    )
