"""DDP502 at run time judges only what the evidence supports: a shuffling loader without a
DistributedSampler is reported once its batches reach the job, that is once a collective (DDP's gradient
all_reduce, FSDP's all-gathers, an explicit one) has run while one of its passes was in progress. A loader
that feeds a rank-local model (a per-rank reference run, the same data on every rank on purpose) is fine,
and is never reported.

The default group's sequence number counts every collective, those DDP issues from C++ included. It is
read when a suspect loader's pass starts and at each of that pass's batches; loaders that are not suspect
cost nothing, and the batch hook is installed only while some loader is suspect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..failsafe import failsafe
from ..findings import Finding

MAX_HELD = 256


def collectives_so_far() -> int | None:
    """The default group's sequence number (every collective it has run), None without one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.distributed_c10d._get_default_group()
    sequence = getattr(group, "_get_sequence_number_for_group", None)
    return int(sequence()) if sequence is not None else None


class ShuffleEvidence:
    """Findings held back until a pass of their loader meets a collective."""

    def __init__(self, report: Callable[[Finding], None]) -> None:
        import torch.utils.data.dataloader as dataloader

        self._report = report
        self._iterator_class = dataloader._BaseDataLoaderIter
        self._next = self._iterator_class.__dict__["__next__"]
        self._held: dict[int, tuple[Any, list[Finding]]] = {}  # id(loader) -> (loader, findings)
        self._passes: dict[int, tuple[int, int]] = {}  # id(iterator) -> (id(loader), sequence at its start)
        self._hooked = False

    def hold(self, loader: Any, findings: list[Finding]) -> None:
        """Keep `findings` about `loader` until one of its passes meets a collective."""
        if findings:
            if len(self._held) >= MAX_HELD:  # loaders made per epoch: the oldest suspicion goes
                self._held.pop(next(iter(self._held)))
            self._held[id(loader)] = (loader, findings)
            self._hook()

    def pass_started(self, loader: Any, iterator: Any) -> None:
        self._passes.pop(id(iterator), None)  # an id an ended iterator had
        if id(loader) not in self._held:
            return
        start = collectives_so_far()
        if start is not None:
            self._passes[id(iterator)] = (id(loader), start)

    def _batch(self, iterator: Any) -> None:
        started = self._passes.get(id(iterator))
        if started is None:
            return
        now = collectives_so_far()
        if now is None or now <= started[1]:
            return
        held = self._held.pop(started[0], None)
        self._passes = {k: v for k, v in self._passes.items() if v[0] != started[0]}
        if held is not None:
            for finding in held[1]:
                self._report(finding)
        if not self._held:
            self.uninstall()

    def _hook(self) -> None:
        if self._hooked:
            return
        original = self._next
        watch = self

        def __next__(iterator: Any) -> Any:
            try:
                return original(iterator)
            finally:  # a batch, or the pass's end (StopIteration): the last batch's collectives count too
                if watch._passes:
                    with failsafe("audits: whether a suspect loader's batch met a collective"):
                        watch._batch(iterator)

        self._iterator_class.__next__ = __next__  # type: ignore[method-assign,assignment]
        self._hooked = True

    def uninstall(self) -> None:
        if self._hooked:
            self._iterator_class.__next__ = self._next  # type: ignore[method-assign]
            self._hooked = False
