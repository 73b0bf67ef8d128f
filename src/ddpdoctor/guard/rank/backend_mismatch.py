"""F1 in a rank: a collective's tensor on a device its group has no backend for. The call is answered
with the finding, and either torch's call run the remedy's way (`remedy=True`) or a clear error in its
place (torch's own would name neither the group's backend nor the fix)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...audits.backend_device import (
    BackendDeviceMismatchError,
    BarrierDevice,
    barrier_device_type,
    error_text,
    mismatch_finding,
)
from ...audits.remedy_limits import refusal
from ...findings import Finding, Severity
from ..fingerprint import CollectiveFingerprint
from . import intercept
from .groups import GroupInfo
from .remedy import Remedy


def barrier_mismatch(group: Any, args: tuple, kwargs: dict, types: frozenset[str]) -> BarrierDevice | None:
    """A barrier has no tensor, but torch picks a device for it and fails the same way on a group
    without a backend for that device (an NCCL-only group used where torch sees no accelerator)."""
    device_ids = args[2] if len(args) > 2 else kwargs.get("device_ids")
    predicted = barrier_device_type(group, device_ids)
    if predicted is not None and predicted not in types:
        return BarrierDevice(predicted)
    return None


def respond(
    spec: intercept.OpSpec,
    group: Any,
    info: GroupInfo,
    tensor: Any,
    fp: CollectiveFingerprint,
    *,
    rank: int | None,
    remedy: bool,
    record: Callable[[Finding], None],
    args: tuple = (),
    kwargs: dict | None = None,
) -> Remedy | BackendDeviceMismatchError:
    """The finding, recorded, and what the wrapper does in place of torch's call: the remedy, or the error
    (without `--remedy`, or where the remedy could not guarantee the call's result: see remedy_limits)."""
    backends = sorted(info.device_types)
    refused = None
    if remedy and not isinstance(tensor, BarrierDevice):
        refused = refusal(fp.signature.reduce_op, Remedy.runs_on_gloo(backends),
                          Remedy.written_tensors(spec, args, kwargs or {}))
    finding = mismatch_finding(
        op=spec.name,
        tensor=tensor,
        group_name=info.name,
        backends=backends,
        backend_name=info.backend,
        site=fp.site,
        library=fp.library,
        metric=fp.metric,
        rank=rank,
        severity=Severity.WARNING if remedy and refused is None else Severity.ERROR,
        refused=refused,
    )
    record(finding)
    if remedy and refused is None:
        return Remedy(spec, group, backends, finding, fp.site)
    return BackendDeviceMismatchError(
        error_text(finding, finding.fix.message if finding.fix else ""), finding
    )
