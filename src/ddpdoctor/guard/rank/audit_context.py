"""The guard's side of `audits/context.py`: what the runtime audits it installs in a rank may ask of it.

Asked at each use, not at install: the audits are installed once per process, and a later default group
(after `destroy_process_group`) has its own store and its own keys (`GuardRuntime.generation`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...audits.context import AuditStore
from ...findings import Finding
from ..protocol import StoreKeys
from .store_link import own_client

if TYPE_CHECKING:
    from .runtime import GuardRuntime


class RankAuditContext:
    """An `AuditContext` over this rank's `GuardRuntime`."""

    def __init__(self, runtime: GuardRuntime) -> None:
        self._runtime = runtime

    def report(self, finding: Finding) -> None:
        self._runtime.record_finding(finding)

    def store(self, namespace: str, timeout_s: float | None = None) -> AuditStore | None:
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() <= 1:
            return None
        keys = StoreKeys(restart=self._runtime.config.restart, generation=self._runtime.generation)
        return AuditStore(own_client(namespace, timeout_s), keys.prefix + namespace + "/")

    def sequence(self) -> int:
        import torch.distributed.distributed_c10d as c10d

        runtime = self._runtime
        if runtime.default_group is not None:
            known = runtime.sequence_numbers().get(runtime.info(runtime.default_group).name)
            if known is not None:
                return int(known)
        return int(c10d._get_default_group()._get_sequence_number_for_group())  # type: ignore[attr-defined]
