"""F1 `backend-device-mismatch`: a tensor on a device type the group has no backend for.

Checked before the collective runs, in the caller's thread. Without the guard torch raises
"No backend type associated with device type cpu" from deep inside distributed_c10d, naming neither the
tensor nor who issued the call; the error raised here names both, and (for Lightning) the metric whose
sync it is. The remedy mode performs the collective on a device the group supports instead (the guard's
`rank/remedy.py`, which runs it through the guard's own wrapper).
"""

from __future__ import annotations

from typing import Any

from ..advice import class_references
from ..failsafe import failsafe
from ..findings import Evidence, Finding, Fix, Location, Severity
from ..records import Frame, MetricOrigin

CLASS = "backend-device-mismatch"


class BackendDeviceMismatchError(RuntimeError):
    """Raised instead of torch's "No backend type associated with device type ..." (a RuntimeError too)."""

    def __init__(self, message: str, finding: Finding) -> None:
        super().__init__(message)
        self.finding = finding


class BarrierDevice:
    """Stands in for the tensor of a `barrier()`, which has none: torch picks a device for it (see
    `barrier_device_type`), and fails the same way when the group has no backend for that device."""

    def __init__(self, device_type: str) -> None:
        import torch

        self.device = torch.device(device_type)


def barrier_device_type(group: Any, device_ids: Any) -> str | None:
    """The device type torch 2.x's `barrier()` runs on, by its own rules (distributed_c10d.barrier): the
    accelerator with `device_ids`, the group's bound device, the CPU when there is no accelerator or the
    group collects objects on the CPU, else the accelerator. None when it cannot be told."""
    with failsafe("device_check.barrier_device_type: another torch version, not judged"):
        import torch
        from torch.distributed import distributed_c10d as c10d

        accelerator = torch._C._get_accelerator()
        if isinstance(device_ids, list):
            return str(accelerator.type)
        bound = getattr(group, "bound_device_id", None)
        if bound is not None:
            return str(bound.type)
        if accelerator.type == "cpu" or c10d._get_object_coll_device(group) == "cpu":
            return "cpu"
        return str(accelerator.type)
    return None


def describe_tensor(tensor: Any) -> str:
    if isinstance(tensor, BarrierDevice):
        return (f"no tensor, so torch runs the barrier on {tensor.device} (no accelerator on this machine, "
                "no `device_ids`, no bound device)")
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"tensor of shape {list(tensor.shape)} dtype {dtype} on {tensor.device}"


def _fixes(
    device_type: str, backends: list[str], library: Frame | None, metric: MetricOrigin | None
) -> list[str]:
    fixes = []
    if metric is not None:
        fixes.append(
            f"the metric `{metric.name}` holds state on {device_type}: upgrade Lightning (>= 2.4 moves "
            "logged results to the value's device on every `log`), or log a tensor created on `self.device`"
        )
    target = "cuda" if "cuda" in backends else (backends[0] if backends else "the rank's device")
    fixes.append(f"create the tensor on the rank's device (`torch.tensor(x, device=...)`, `.to({target!r})`)")
    if device_type == "cpu":
        fixes.append(
            'initialise with backend="cpu:gloo,cuda:nccl" so the group has a backend for CPU tensors'
        )
    if library is not None and str(library.library).partition(".")[0] not in ("torch", "python"):
        fixes.append(
            f"upgrade `{library.library}`, the library that issued this collective, or file an issue there"
        )
    fixes.append("or run under `ddpdoctor run --remedy` to move the data to a supported device for this call")
    return fixes


def _evidence_lines(
    op: str, tensor: Any, group_name: str, backends: list[str], backend_name: str,
    site: Frame | None, library: Frame | None, metric: MetricOrigin | None,
) -> list[str]:
    """What happened, who issued it and whose sync it is: the finding's message, one line per fact."""
    lines = [
        f"{op}: {describe_tensor(tensor)}, but process group {group_name!r} ({backend_name}) has backends "
        f"only for {', '.join(backends) or 'nothing'} (torch would fail with: No backend type associated "
        f"with device type {tensor.device.type})",
    ]
    if library is not None and library.library not in (None, "torch"):
        lines.append(f"issued by {library.library} at {library.short()} in {library.function}")
    if metric is not None:
        text = f"for metric `{metric.name}`, logged with sync_dist=True"
        if metric.path:
            text += f" at {metric.path}:{metric.line}"
        lines.append(text + (f" in {metric.hook}" if metric.hook else ""))
    if site is not None:
        lines.append(f"called from {site.short()} in {site.function}")
    return lines


def _locations(
    site: Frame | None, library: Frame | None, metric: MetricOrigin | None, rank: int | None,
) -> list[Location]:
    """The metric's log call, the call site, the issuing library's frame: each once, in that order."""
    locations = []
    if metric is not None and metric.path:
        locations.append(Location(metric.path, metric.line, rank=rank))
    if site is not None:
        locations.append(Location(site.path, site.line, rank=rank))
    if library is not None:
        locations.append(Location(library.path, library.line, rank=rank))
    return list(dict.fromkeys(locations))


def _facts(
    op: str, tensor: Any, group_name: str, backends: list[str], backend_name: str,
    library: Frame | None, metric: MetricOrigin | None,
) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "op": op,
        "shape": list(tensor.shape) if hasattr(tensor, "shape") else None,
        "dtype": str(tensor.dtype).replace("torch.", "") if hasattr(tensor, "dtype") else None,
        "device": str(tensor.device),
        "group": group_name,
        "backend": backend_name,
        "group_device_types": backends,
        "library": library.library if library else None,
    }
    if metric is not None:
        facts["metric"] = metric.name
    return facts


def mismatch_finding(
    *,
    op: str,
    tensor: Any,
    group_name: str,
    backends: list[str],
    backend_name: str,
    site: Frame | None,
    library: Frame | None,
    metric: MetricOrigin | None,
    rank: int | None,
    severity: Severity = Severity.ERROR,
    refused: str | None = None,
) -> Finding:
    """`refused`: why `--remedy` would not run this call (remedy_limits.refusal), if it would not."""
    lines = _evidence_lines(op, tensor, group_name, backends, backend_name, site, library, metric)
    # A barrier carries no metric state: the metric only says whose sync it is.
    fixes = _fixes(
        tensor.device.type, backends, library, None if isinstance(tensor, BarrierDevice) else metric
    )
    if refused is not None:
        lines.insert(1, f"not remedied: {refused}")
        fixes = [fix for fix in fixes if "--remedy" not in fix]
    return Finding(
        class_=CLASS,
        message="; ".join(lines),
        severity=severity,
        locations=tuple(_locations(site, library, metric, rank)),
        fix=Fix("; ".join(fixes)),
        evidence=tuple(Evidence(text, rank=rank) for text in lines),
        references=class_references(CLASS),
        facts=_facts(op, tensor, group_name, backends, backend_name, library, metric),
    )


def error_text(finding: Finding, fixes_text: str) -> str:
    body = finding.message.replace("; ", "\n  ")
    fixes = "\n".join(f"  - {f}" for f in fixes_text.split("; "))
    return f"[ddpdoctor] backend-device-mismatch\n  {body}\nfixes:\n{fixes}"
