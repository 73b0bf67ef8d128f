"""The advice a guard finding gives: per decision, where the decision knows more than its class."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .verdict import Verdict

FIXES = {
    "collective-divergence": (
        "call the collective on every rank of the group and guard only the side effect (e.g. the print or "
        "save) with the rank test; for Lightning logging use `rank_zero_only=True` (no sync) or log the same "
        "key on every rank; make loop lengths equal (`drop_last=True`, `torch.distributed.algorithms.Join`, "
        "an all-reduced stop flag); give every rank the same shapes and dtypes"
    ),
    # a peer past the position through a collective issued from C++: DDP's gradient all_reduce, in a
    # backward pass the other ranks did not run
    "uneven-steps": (
        "one rank ran a backward pass (DDP issues its gradient all_reduce from C++) that the others did not: "
        "give every rank the same number of batches (`DistributedSampler` with `drop_last=True`, equal "
        "shards), wrap the training loop in `torch.distributed.algorithms.Join([model])` for uneven inputs, "
        "or all-reduce a stop flag every step and leave the loop together; a batch skipped on one rank (a NaN "
        "check) must be skipped on every rank"
    ),
    "dead-rank": (
        "find why that rank died first (its own log: OOM killer, a Python exception, a signal); the other "
        "ranks only waited for it"
    ),
    # a dead rank whose signal says more than "find why it died"
    "dead-rank-killed": (
        "that rank was killed (SIGKILL: the kernel's OOM killer, or a scheduler's memory or time limit): check "
        "`dmesg` / `journalctl -k` for `Out of memory: Killed process` and the job's memory limit; reduce host "
        "memory (DataLoader workers, pinned memory, a dataset loaded whole on every rank) or raise the limit; "
        "the other ranks only waited for it"
    ),
    "dead-rank-crashed": (
        "that rank crashed in native code at the line named: look at the native call made there (an "
        "extension, a `ctypes` call, a CUDA kernel) and at the versions of torch, CUDA/NCCL and compiled "
        "extensions; the other ranks only waited for it"
    ),
    "dead-rank-bus": (
        "that rank got SIGBUS, most often a full `/dev/shm` (DataLoader workers pass batches through it): "
        "give the container more shared memory (`--shm-size`, `--ipc=host`) or use fewer workers; the other "
        "ranks only waited for it"
    ),
    "collective-timeout": (
        "the rank(s) outside the collective are still busy or stuck elsewhere (see their stacks): make every "
        "rank reach the collective, or raise the backend timeout if the work is legitimately slow"
    ),
}


def fix_for(verdict: Verdict) -> str:
    return FIXES.get(verdict.fix or verdict.class_, "")


def class_references(slug: str) -> tuple[str, ...]:
    """The catalogue's references for a class, for a finding; none if the catalogue cannot be read."""
    try:
        from ..catalogue import CATALOGUE

        found = CATALOGUE.get(slug)
        return tuple(found.references) if found is not None else ()
    except Exception:  # noqa: BLE001 - the report must not depend on the catalogue loading
        return ()
