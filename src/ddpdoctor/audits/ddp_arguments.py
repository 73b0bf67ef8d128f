"""DDP's own refusal of its arguments, said before DDP says it: `device_ids` given for a module whose
parameters are on the CPU (a GPU script run on a CPU machine). DDP raises then, and that is the failure to
name; judging the module's placement against `cuda:<device_ids[0]>` would advise a device the machine may
not have."""

from __future__ import annotations

from typing import Any

import torch

from ..findings import Finding, Fix, Severity


def refused_device_ids(module: Any, device_ids: Any) -> Finding | None:
    """A finding when DDP will refuse `device_ids` for `module`'s placement, else None."""
    if not device_ids or not isinstance(module, torch.nn.Module):
        return None
    devices = {p.device.type for p in module.parameters()}
    if devices != {"cpu"}:
        return None
    machine = (
        "this machine has no CUDA device" if not torch.cuda.is_available()
        else "the module was not moved to a GPU before it was wrapped"
    )
    return Finding(
        class_="foreign-device-hooks",
        message=(
            f"DistributedDataParallel is given device_ids={list(device_ids)!r} for a module whose parameters "
            f"are on cpu ({machine}): DDP refuses device_ids for a CPU module and raises its own error "
            "(`device_ids and output_device arguments only work with single-device/multiple-device GPU "
            "modules or CPU modules`)."
        ),
        severity=Severity.ERROR,
        fix=Fix(
            "On CPU (gloo), wrap without device_ids: `DistributedDataParallel(model)`; on GPUs, move the "
            "module to the rank's device first (`model.to(local_rank)`) and pass `device_ids=[local_rank]`."
        ),
        facts={"device_ids": [str(d) for d in device_ids], "module_device": "cpu",
               "cuda_available": torch.cuda.is_available()},
    )
