"""Sampler shapes the audits must see through, shared by the audit tests and the Lightning callback tests."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler, Sampler


class BucketSampler(Sampler[int]):
    """Holds a DistributedSampler and forgets to forward `set_epoch` to it: neither Lightning nor a
    training loop that calls `loader.sampler.set_epoch` reaches the inner one."""

    def __init__(self, base: DistributedSampler) -> None:
        self.base_sampler = base

    def __iter__(self) -> Iterator[int]:
        return iter(self.base_sampler)

    def __len__(self) -> int:
        return len(self.base_sampler)
