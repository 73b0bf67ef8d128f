"""F7 sampler-epoch: a `DistributedSampler` whose epoch never changes, and a shuffling loader that does not
split the data between ranks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ddpdoctor.findings import Finding, Fix, Severity

from .generators import audit_loader_generators, iter_loaders
from .job import job_world_size


def _samplers(loader: Any, depth: int = 4) -> Iterator[tuple[str, Any]]:
    """Every object reachable from the loader through attributes whose name mentions a sampler."""
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
                (f"{path}.{key}", value) for key, value in attributes.items() if "sampler" in key.lower()
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
        findings += _unsharded_shuffle(single, label, job_world_size(world_size))
    return findings


def _unsharded_shuffle(loader: Any, name: str, world_size: int) -> list[Finding]:
    if world_size <= 1:
        return []
    samplers = list(_samplers(loader))
    if any(isinstance(s, torch.utils.data.DistributedSampler) for _, s in samplers):
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
                "DistributedSampler: each rank draws from the whole dataset it was given, so unless the program "
                "gives every rank a shard of its own (a per-rank Subset, its own files), ranks train on "
                "overlapping (with equal seeds: identical) data."
            ),
            severity=Severity.WARNING,
            fix=Fix(
                "Use `DistributedSampler(dataset, shuffle=True)` and call `sampler.set_epoch(epoch)` each epoch "
                "(Lightning does both unless `use_distributed_sampler=False`)."
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
            for path, sampler in _samplers(loader):
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
                " Lightning calls `set_epoch` only on `loader.sampler` and `loader.batch_sampler.sampler`; this "
                "one is nested deeper, so the wrapper around it must forward `set_epoch`."
            )
        return Finding(
            class_="sampler-epoch",
            message=(
                f"the DistributedSampler `{path}` of the {label} is still at epoch {epoch} after {self._observations} "
                "epochs: `set_epoch` is never called on it, so every epoch visits the data in the same order."
                + lightning_note
            ),
            severity=Severity.WARNING,
            fix=Fix(
                "Call `sampler.set_epoch(epoch)` at the start of every epoch (or forward `set_epoch` from your "
                "sampler wrapper to the DistributedSampler it holds)."
            ),
            facts={"loader": label, "sampler": path, "epoch": epoch},
        )

