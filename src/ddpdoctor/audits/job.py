"""What every audit asks about the job it runs in: the rank's device, whether this is a multi-rank job,
its world size; and the warning category the audits emit. (The job's store and the rank's findings come
from the guard that installs the runtime audits: context.py.)"""

from __future__ import annotations

import os

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
