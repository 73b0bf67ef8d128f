"""F2 init-module-scope: a default-device context around `fit` (`trainer.init_module()`, `torch.device(...)`)
that will break the data pipeline's generators."""

from __future__ import annotations

import torch

from ddpdoctor.findings import Finding, Fix, Severity

# ------------------------------------------------------------------------------------- default device


def _active_device_context() -> tuple[torch.device, bool] | None:
    """(device, scoped) of the DeviceContext in force, if any; `scoped` is False for `set_default_device`."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    modes = [m for m in _get_current_function_mode_stack() if isinstance(m, DeviceContext)]
    if not modes:
        return None
    mode = modes[-1]
    global_context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return mode.device, mode is not global_context


def audit_default_device(action: str = "trainer.fit") -> list[Finding]:
    """Say whether `action` runs under a default-device context that will break the data pipeline (F2)."""
    active = _active_device_context()
    if active is None:
        return []
    device, scoped = active
    if not scoped and device.type == "cpu":
        return []
    # What the sampler's first draw raises on that device; Lightning then adds its own chained error.
    if device.type == "meta":
        first = "`Tensor.item() cannot be called on meta tensors`"
    else:
        accelerator = "cuda" if device.type == "cpu" else device.type
        first = f"`RuntimeError: Expected a '{accelerator}' device type for generator but found 'cpu'`"
    symptom = f"{first}, then (Lightning) `Please call iter(combined_loader) first`"
    if scoped:
        message = (
            f"`{action}` runs inside a `torch.device({str(device)!r})` context, as `with "
            "trainer.init_module():` or `with torch.device(...):` create: every tensor the data pipeline "
            "creates lands on "
            f"{device}, while DistributedSampler and RandomSampler draw with CPU generators"
        )
        message += (
            f"; it will fail with {symptom}"
            if device.type != "cpu"
            else f"; harmless on the CPU, it fails with {symptom} on GPUs"
        )
        fix = (
            "Wrap only the model construction in `trainer.init_module()` / `torch.device(...)`; build the "
            "data and call `fit`/`validate`/`test` outside the block."
        )
    else:
        message = (
            f"`{action}` runs after `torch.set_default_device({str(device)!r})`: samplers and loaders then "
            f"create their tensors on {device} and their CPU generators no longer match; it fails with "
            f"{symptom}"
        )
        fix = (
            "Do not set a global default device in training scripts; place the model explicitly or use "
            "`init_module()` for it alone."
        )
    return [
        Finding(
            class_="init-module-scope",
            message=message + ".",
            severity=Severity.ERROR if device.type != "cpu" else Severity.WARNING,
            fix=Fix(fix),
            facts={"default_device": str(device), "scoped": scoped},
        )
    ]


