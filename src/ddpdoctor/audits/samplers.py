"""F7 sampler-epoch: a `DistributedSampler` whose epoch never changes, and a shuffling loader that does not
split the data between ranks."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ddpdoctor.findings import Finding, Fix, Location, Severity
from ddpdoctor.render.paths import short_path

from .generators import audit_loader_generators, iter_loaders
from .job import job_world_size


def sampler_chain(loader: Any, depth: int = 4) -> Iterator[tuple[str, Any]]:
    """Every object reachable from the loader through attributes whose name mentions a sampler or whose value
    is one (a wrapper's `self.inner`)."""
    seen: set[int] = set()
    frontier: list[tuple[str, Any]] = [
        (attr, getattr(loader, attr, None)) for attr in ("sampler", "batch_sampler")
    ]
    for _ in range(depth):
        following: list[tuple[str, Any]] = []
        for path, obj in frontier:
            if obj is None or id(obj) in seen or isinstance(obj, (int, float, str, bool)):
                continue
            seen.add(id(obj))
            yield path, obj
            attributes = getattr(obj, "__dict__", {})
            following.extend(
                (f"{path}.{key}", value)
                for key, value in attributes.items()
                if "sampler" in key.lower() or isinstance(value, torch.utils.data.Sampler)
            )
        frontier = following


def audit_loader(loader: Any, *, name: str = "dataloader", world_size: int | None = None) -> list[Finding]:
    """Generator devices (F2) and, in a multi-rank job, a shuffling loader that does not shard (F7).

    `loader` may also be a Lightning CombinedLoader or a collection of loaders. `world_size` defaults to
    the initialised process group's, else `WORLD_SIZE`. A `DistributedSampler` whose epoch never moves
    needs watching across epochs: see `EpochWatch`.
    """
    findings: list[Finding] = []
    for label, single in iter_loaders(loader, name):
        findings += audit_loader_generators(single, label)
        findings += unsharded_shuffle(single, label, job_world_size(world_size))
    return findings


def _shards(sampler: Any) -> bool:
    """Whether a sampler splits the data between ranks: a DistributedSampler (Lightning's wrappers are
    subclasses), or a sampler that knows it is one of several, as accelerate's `BatchSamplerShard`
    (`num_processes`) is."""
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        return True
    for attribute in ("num_replicas", "num_processes"):
        value = getattr(sampler, attribute, None)
        if isinstance(value, int) and value > 1:
            return True
    return False


def unsharded_shuffle(loader: Any, name: str, world_size: int) -> list[Finding]:
    if world_size <= 1:
        return []
    samplers = list(sampler_chain(loader))
    if any(_shards(s) for _, s in samplers):
        return []
    shuffling = [(p, s) for p, s in samplers if isinstance(s, torch.utils.data.RandomSampler)]
    if not shuffling:
        return []
    path, _ = shuffling[0]
    return [
        Finding(
            class_="sampler-epoch",
            message=(
                f"the {name} shuffles with a RandomSampler (`{path}`) in a {world_size}-rank job and has no "
                "DistributedSampler: each rank draws from the whole dataset it was given, so unless the "
                "program gives every rank a shard of its own (a per-rank Subset, its own files), ranks train "
                "on "
                "overlapping (with equal seeds: identical) data."
            ),
            severity=Severity.WARNING,
            fix=Fix(
                "Use `DistributedSampler(dataset, shuffle=True)` and call `sampler.set_epoch(epoch)` each "
                "epoch (Lightning does both unless `use_distributed_sampler=False`)."
            ),
            facts={"loader": name, "sampler": path, "world_size": world_size},
        )
    ]


class EpochWatch:
    """Notice a shuffling DistributedSampler whose epoch never changes (F7).

    Call `observe(loaders)` once per epoch, after the training loop has had its chance to call
    `set_epoch` (Lightning: at the epoch's first training batch). From the second observation on,
    a sampler whose `epoch` is still what it was yields one finding; `findings` keeps them all.
    """

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self._last: dict[int, int] = {}
        self._flagged: set[int] = set()
        self._observations = 0

    def observe(self, loaders: Any, name: str = "train dataloader") -> list[Finding]:
        self._observations += 1
        new: list[Finding] = []
        for label, loader in iter_loaders(loaders, name):
            for path, sampler in sampler_chain(loader):
                if not isinstance(sampler, torch.utils.data.DistributedSampler) or not sampler.shuffle:
                    continue
                key = id(sampler)
                epoch = int(sampler.epoch)
                previous = self._last.get(key)
                self._last[key] = epoch
                if previous is None or previous != epoch or key in self._flagged:
                    continue
                self._flagged.add(key)
                new.append(self._finding(label, path, epoch))
        self.findings += new
        return new

    def _finding(self, label: str, path: str, epoch: int) -> Finding:
        lightning_note = ""
        if path not in ("sampler", "batch_sampler.sampler"):
            lightning_note = (
                " Lightning calls `set_epoch` only on `loader.sampler` and `loader.batch_sampler.sampler`; "
                "this one is nested deeper, so the wrapper around it must forward `set_epoch`."
            )
        return Finding(
            class_="sampler-epoch",
            message=(
                f"the DistributedSampler `{path}` of the {label} is still at epoch {epoch} after "
                f"{self._observations} "
                "epochs: `set_epoch` is never called on it, so every epoch visits the data in the same order."
                + lightning_note
            ),
            severity=Severity.WARNING,
            fix=Fix(
                "Call `sampler.set_epoch(epoch)` at the start of every epoch (or forward `set_epoch` from "
                "your "
                "sampler wrapper to the DistributedSampler it holds)."
            ),
            facts={"loader": label, "sampler": path, "epoch": epoch},
        )



# ------------------------------------------------------------------------------ at each iteration (guard)


@dataclass(frozen=True)
class Place:
    """A line of the user's program: where a sampler was built, or the loop that iterates it."""

    path: str
    line: int
    library: str | None = None  # the library between that line and the iteration (Lightning's fit loop)

    def __str__(self) -> str:
        return f"{short_path(self.path)}:{self.line}"


@dataclass
class _Iterations:
    epoch: int
    set_epoch_calls: int
    set_epoch_ever: bool
    epoch_moved: bool = False
    unmoved_set_epochs: int = 0  # `set_epoch` calls between two iterations that left the epoch where it was
    reported: bool = False


class IterationWatch:
    """F7 at the moment a shuffling DistributedSampler is iterated again (the guard calls `iterated` from
    `DataLoader.__iter__`, once per epoch per loader).

    A sampler iterated a second time at the same epoch, with `set_epoch` never called on it, is reported
    then: its epoch never moves. Where the program does call `set_epoch`, a second pass at the same epoch is
    not enough (a `next(iter(loader))` peek before the loop, an evaluation pass over the training loader):
    it is reported once a `set_epoch` call left the epoch unchanged between two passes for the second time
    (`set_epoch(0)` every epoch). One finding per sampler, at most.

    A sampler is known by the line that built it, its dataset and its seed where the line is known: a loop
    that builds a fresh DistributedSampler every epoch starts each at epoch 0 with the same seed, which is
    the same order every epoch as surely as one sampler never moved. Otherwise it is known by identity.
    """

    def __init__(self) -> None:
        self._state: dict[tuple[Any, ...], tuple[Any, _Iterations]] = {}

    def iterated(
        self, sampler: Any, path: str, set_epoch_calls: int, loop: Place | None, built: Place | None
    ) -> Finding | None:
        epoch = int(getattr(sampler, "epoch", 0))
        key: tuple[Any, ...]
        if built is not None:
            key = (
                built.path,
                built.line,
                id(getattr(sampler, "dataset", None)),
                getattr(sampler, "seed", None),
            )
        else:
            key = (id(sampler),)
        known = self._state.get(key)
        same_object = known is not None and known[0]() is sampler
        if known is None or (built is None and not same_object):
            if len(self._state) > 4096:  # samplers made per epoch: forget the dead ones
                self._state = {k: v for k, v in self._state.items() if v[0]() is not None}
            self._state[key] = (
                weakref.ref(sampler),
                _Iterations(epoch, set_epoch_calls, set_epoch_calls > 0),
            )
            return None
        state = known[1]
        if not same_object:  # a fresh sampler from the same line: its calls are its own
            self._state[key] = (weakref.ref(sampler), state)
        called_since = set_epoch_calls > (state.set_epoch_calls if same_object else 0)
        state.set_epoch_ever = state.set_epoch_ever or called_since
        state.set_epoch_calls = set_epoch_calls
        if epoch != state.epoch:
            state.epoch, state.epoch_moved = epoch, True
            return None
        if state.reported:
            return None
        if called_since:
            state.unmoved_set_epochs += 1
        never_moves = not state.set_epoch_ever and not state.epoch_moved
        if not never_moves and state.unmoved_set_epochs < 2:
            return None
        state.reported = True
        return repeated_epoch_finding(sampler, path, epoch, loop, built, set_epoch_called=not never_moves,
                                      fresh=not same_object)


def repeated_epoch_finding(
    sampler: Any, path: str, epoch: int, loop: Place | None, built: Place | None, *, set_epoch_called: bool,
    fresh: bool = False,
) -> Finding:
    kind = type(sampler).__name__
    what = f"the {kind}" + (f" built at {built}" if built else "") + " (shuffle=True)"
    if fresh:
        seed = getattr(sampler, "seed", 0)
        what += f", built again for this pass over the same dataset with the same seed ({seed}),"
    by = (
        f" by the loop at {loop}" + (f" (through {loop.library})" if loop and loop.library else "")
        if loop
        else ""
    )
    if set_epoch_called:
        cause = (
            f"`set_epoch` is called with the epoch it already has ({epoch}), so every epoch visits the data "
            "in "
            "the same order"
        )
    else:
        cause = "`set_epoch` is never called on it, so every epoch visits the data in the same order"
    nested = path not in ("sampler", "batch_sampler.sampler")
    forward = (
        f" It sits at `loader.{path}`: the wrapper around it must forward `set_epoch` (Lightning and "
        "accelerate "
        "call it only on `loader.sampler` and `loader.batch_sampler.sampler`)."
        if nested
        else ""
    )
    return Finding(
        class_="sampler-epoch",
        message=f"{what} is iterated again at epoch {epoch}{by}: {cause}.{forward}",
        severity=Severity.WARNING,
        locations=tuple(Location(place.path, place.line) for place in (loop, built) if place is not None),
        fix=Fix(
            "Call `sampler.set_epoch(epoch)` at the start of every epoch, before the loop iterates the loader"
            + (
                " (or forward `set_epoch` from your sampler wrapper to the DistributedSampler it holds)."
                if nested
                else "."
            )
        ),
        facts={
            "sampler": path,
            "sampler_class": kind,
            "epoch": epoch,
            "loop": str(loop) if loop else None,
            "built": str(built) if built else None,
        },
    )
