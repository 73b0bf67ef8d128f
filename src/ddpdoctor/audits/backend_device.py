"""F1 `backend-device-mismatch`: a tensor on a device type the group has no backend for.

Checked before the collective runs, in the caller's thread. Without the guard torch raises
"No backend type associated with device type cpu" from deep inside distributed_c10d, naming neither the
tensor nor who issued the call; the error raised here names both, and (for Lightning) the metric whose
sync it is. The remedy mode performs the collective on a device the group supports instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
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


# Tensor arguments a collective only reads; everything else may be written (all_reduce's and broadcast's
# `tensor`, the output lists).
_READ_ONLY = frozenset({"input", "input_tensor", "input_list", "input_tensor_list", "scatter_list"})
_READ_ONLY_PER_OP = frozenset(
    {("all_gather", "tensor"), ("gather", "tensor"), ("all_gather_coalesced", "input_tensor_list")}
)


def _writes(op: str, param: str) -> bool:
    return param not in _READ_ONLY and (op, param) not in _READ_ONLY_PER_OP


class Remedy:
    """Runs one collective on copies placed where the group has a backend, then copies the results back."""

    _warned: set[tuple[str, int] | None] = set()
    _side_groups: dict[Any, Any] = {}

    def __init__(
        self, spec: Any, group: Any, backends: list[str], finding: Finding, site: Frame | None
    ) -> None:
        self.spec = spec
        self.group = group
        self.backends = backends
        self.finding = finding
        self.site = site

    @staticmethod
    def runs_on_gloo(backends: list[str]) -> bool:
        """Whether the remedy runs a call of a group with these backends on a gloo group of its own."""
        import torch

        return not ("cuda" in backends and torch.cuda.is_available())

    @staticmethod
    def written_tensors(spec: Any, args: tuple, kwargs: dict) -> list[Any]:
        """The tensors a call writes, as the caller passed them."""
        import torch

        found: list[Any] = []

        def collect(value: Any) -> None:
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    collect(item)

        for index, name, _compared in spec.tensors:
            if _writes(spec.name, name):
                collect(args[index] if index < len(args) else kwargs.get(name))
        return found

    def _target(self) -> tuple[Any, Any]:
        """(device to copy tensors to, group to run on)."""
        import torch
        import torch.distributed as dist

        from ..guard.rank import intercept

        if not self.runs_on_gloo(self.backends):
            return torch.device("cuda", torch.cuda.current_device()), self.group
        # No device of a supported type here (a CPU tensor on an NCCL-only group of a CPU job, or the
        # `cuda:gloo` reproduction): run on a gloo group over the same ranks, created once per group.
        side = self._side_groups.get(self.group)
        if side is None:
            ranks = dist.get_process_group_ranks(self.group)
            intercept._local.depth = True
            try:
                side = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
            finally:
                intercept._local.depth = False
            self._side_groups[self.group] = side
        return torch.device("cpu"), side

    def _warn_once(self) -> None:
        key = (self.site.path, self.site.line) if self.site else None
        if key not in self._warned:
            self._warned.add(key)
            print(
                f"[ddpdoctor] remedy: {self.finding.message.split('; ')[0]}; ran it on a supported device "
                f"instead (warned once per call site)",
                file=sys.stderr,
                flush=True,
            )

    def _moved_arguments(
        self, args: tuple, kwargs: dict, device: Any, group: Any,
    ) -> tuple[list[Any], dict, list[tuple[Any, Any]]]:
        """The call's arguments with every tensor copied to `device` and the group replaced by `group`, and
        the (original, copy) pairs of the tensors the collective writes."""
        import torch

        args_list = list(args)
        kwargs = dict(kwargs)
        pairs: list[tuple[Any, Any]] = []

        def moved(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                # Always a copy, also where the tensor is on `device` already (a CPU job's gloo side group):
                # the call then runs the same way on every machine, and an output that is a view of an
                # input (an in-place reduce_scatter_tensor) gets the result, copied back alone.
                copy = value.to(device, copy=True)
                pairs.append((value, copy))
                return copy
            if isinstance(value, (list, tuple)):
                return type(value)(moved(v) for v in value)
            return value

        written: list[tuple[Any, Any]] = []  # (original, copy) of the tensors the collective writes
        for index, name, _compared in self.spec.tensors:
            start = len(pairs)
            if index < len(args_list):
                args_list[index] = moved(args_list[index])
            elif name in kwargs:
                kwargs[name] = moved(kwargs[name])
            if _writes(self.spec.name, name):
                written += pairs[start:]
        if self.spec.group is not None:
            index, name = self.spec.group
            if index < len(args_list):
                args_list[index] = group
            else:
                kwargs[name] = group
        return args_list, kwargs, written

    def _run_fingerprinted(self, original: Callable[..., Any], args_list: list[Any], kwargs: dict) -> Any:
        """Runs the moved call to completion (an async one waited for) outside the interception."""
        from ..guard.fingerprint import CollectiveFingerprint
        from ..guard.rank import intercept
        from ..guard.rank import wrapper_importlib_bootstrap as wrapper

        # Fingerprinted as the call it now is (the supported device, the group it runs on): a rank that
        # never makes it leaves the others waiting here, and that is seen like any other hang.
        runtime = wrapper._runtime
        fp = runtime.before(self.spec, tuple(args_list), kwargs) if runtime is not None else None
        if fp.__class__ is not CollectiveFingerprint:
            fp = None
        intercept._local.depth = True
        try:
            result = original(*args_list, **kwargs)
            # Waited for before anything is copied back: an async call's Work, and isend/irecv's, which
            # return one without an `async_op` (copying an irecv's buffer back before it arrived would
            # hand back the buffer's old contents).
            for work in result if isinstance(result, list) else (result,):
                if hasattr(work, "wait"):
                    work.wait()
        except BaseException as exc:
            intercept._local.depth = False
            if fp is not None and runtime is not None:
                runtime.failed(fp, exc)
            raise
        intercept._local.depth = False
        if fp is not None and runtime is not None:
            runtime.after(fp)  # waited for already: done
        return result

    def __call__(self, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        import torch

        self._warn_once()
        device, group = self._target()
        args_list, kwargs, written = self._moved_arguments(args, kwargs, device, group)
        result = self._run_fingerprinted(original, args_list, kwargs)
        # Only what the collective wrote goes back: an input copied back could overwrite the result where
        # the output is a view of it (an in-place reduce_scatter_tensor, as FSDP issues it).
        with torch.no_grad():
            for source, copy in written:
                source.copy_(copy)
        return result
