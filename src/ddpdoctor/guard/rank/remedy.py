"""`ddpdoctor run --remedy` for F1 `backend-device-mismatch`: the collective run on copies placed where the
group has a backend, and what it wrote copied back. `audits/backend_device.py` words the finding and
`audits/remedy_limits.py` says where the remedy cannot vouch for the result; this runs inside the guard's
wrapper: the moved call is fingerprinted as the call it now is and issued past the interception."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ...findings import Finding
from ...records import Frame
from .wrapper_importlib_bootstrap import pass_through

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

        if not self.runs_on_gloo(self.backends):
            return torch.device("cuda", torch.cuda.current_device()), self.group
        # No device of a supported type here (a CPU tensor on an NCCL-only group of a CPU job, or the
        # `cuda:gloo` reproduction): run on a gloo group over the same ranks, created once per group.
        side = self._side_groups.get(self.group)
        if side is None:
            ranks = dist.get_process_group_ranks(self.group)
            pass_through(True)
            try:
                side = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
            finally:
                pass_through(False)
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
        from ..fingerprint import CollectiveFingerprint
        from . import wrapper_importlib_bootstrap as wrapper

        # Fingerprinted as the call it now is (the supported device, the group it runs on): a rank that
        # never makes it leaves the others waiting here, and that is seen like any other hang.
        runtime = wrapper._runtime
        fp = runtime.before(self.spec, tuple(args_list), kwargs) if runtime is not None else None
        if fp.__class__ is not CollectiveFingerprint:
            fp = None
        pass_through(True)
        try:
            result = original(*args_list, **kwargs)
            # Waited for before anything is copied back: an async call's Work, and isend/irecv's, which
            # return one without an `async_op` (copying an irecv's buffer back before it arrived would
            # hand back the buffer's old contents).
            for work in result if isinstance(result, list) else (result,):
                if hasattr(work, "wait"):
                    work.wait()
        except BaseException as exc:
            pass_through(False)
            if fp is not None and runtime is not None:
                runtime.failed(fp, exc)
            raise
        pass_through(False)
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
