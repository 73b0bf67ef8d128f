"""What every audit asks about the job it runs in: the rank's device, whether this is a multi-rank job,
its world size; and the warning category the audits emit."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch


class AuditWarning(UserWarning):
    """Category of the warnings the audits emit (filter or catch them like any warning)."""


# --------------------------------------------------------------------------------------------- devices


def rank_device() -> torch.device:
    """The device this rank should hold its model on: `cuda:LOCAL_RANK` when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        local_rank = os.environ.get("LOCAL_RANK")
        index = int(local_rank) if local_rank is not None else torch.cuda.current_device()
        return torch.device("cuda", index)
    return torch.device("cpu")


def in_distributed_job() -> bool:
    if "LOCAL_RANK" in os.environ or "RANK" in os.environ:
        return True
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    # `cuda` without an index means "the current one": compare types only then.
    return a.index is None or b.index is None or a.index == b.index


def job_world_size(given: int | None = None) -> int:
    """`given`, else the default group's size, else WORLD_SIZE, else 1."""
    if given is not None:
        return given
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)



def group_has_cpu_backend() -> bool | None:
    """Whether the default group can run collectives of CPU tensors (gloo, `cpu:gloo,cuda:nccl`); None
    without a group. A device finding names NCCL's refusal of CPU tensors only where it applies."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    backend = str(torch.distributed.get_backend()).lower()
    return "gloo" in backend or "mpi" in backend or backend.startswith("cpu:") or ",cpu:" in backend


# ------------------------------------------------------------------------------------------- the store


def job_store(namespace: str, timeout_s: float | None = None) -> tuple[Any, str] | None:
    """A client of the job's store of its own (a clone: never the training thread's client) and the key
    prefix under which an audit keeps its keys (`namespace` under this run's generation); None outside a
    multi-rank job or where the store cannot be cloned."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from ..failsafe import attempt, failsafe
    from ..guard import current_runtime
    from ..guard.protocol import StoreKeys

    if not dist.is_initialized() or dist.get_world_size() <= 1:
        return None
    store = c10d._get_default_store()
    base: Any = getattr(store, "_underlying_non_prefix_store", None) or store
    clone = attempt(f"{namespace}: cloning the store", base.clone, base)
    if timeout_s is not None:
        with failsafe(f"{namespace}: store timeout"):
            clone.set_timeout(datetime.timedelta(seconds=timeout_s))
    runtime = current_runtime()
    keys = (
        StoreKeys(restart=runtime.config.restart, generation=runtime.generation) if runtime else StoreKeys()
    )
    return clone, keys.prefix + namespace + "/"
