"""F3 foreign-device-hooks at run time: the model audit (`device_placement.audit_model`) when a model is
wrapped for data parallelism, before the wrapper's own code runs.

Patched entry points (once per wrap):

- `DistributedDataParallel.__init__`: plain torch, Lightning's DDP strategies (`DistributedDataParallel(
  module=...)`), `accelerator.prepare`. DDP does not move the module, so every parameter and buffer must be
  on the rank's device already: the whole audit runs (placement owners and tensors). It runs first because
  DDP's constructor raises on a module spread over devices (`DistributedDataParallel's input module must be
  on the same type of devices`), and the finding names the modules that are.
- `FullyShardedDataParallel.__init__` and `fully_shard` (through `_validate_module`, which `fully_shard`
  looks up at each call, so the name a program imported before the guard started is covered): FSDP moves
  the tensors to its device itself (CPU or meta initialisation is the norm), so only the placement owners
  are judged: accelerate hooks, `hf_device_map`, bitsandbytes layers.
- `Accelerator.prepare_model`: placement owners only, before accelerate moves the model, and before its own
  `You can't train a model that has been loaded with device_map='auto'` error.

accelerate hooks that move to the rank's own device and offload nothing (what `device_map={"": local_rank}`
leaves) are not reported here: they are the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..callsite import call_sites
from ..failsafe import failsafe
from ..findings import Evidence, Finding, Location
from .announce import Announcer
from .ddp_arguments import refused_device_ids
from .patching import Uninstall, all_of, patch


def _user_line() -> tuple[str, int] | None:
    """The user's line that led to the wrap; a library's line (the wrap inside accelerate or Lightning)
    where no frame is the user's."""
    user, library = call_sites(2)
    found = user or library
    return (found.path, found.line) if found is not None else None


def _device_of(device_ids: Any) -> Any:
    """The device DDP's `device_ids=[d]` names, else None (the rank's device is then judged by the job)."""
    import torch

    if isinstance(device_ids, (list, tuple)) and len(device_ids) == 1:
        only = device_ids[0]
        if isinstance(only, int):
            # an index names a CUDA device only where there is one; else the job's device is the rank's
            return torch.device("cuda", only) if torch.cuda.is_available() else None
        if isinstance(only, (str, torch.device)):
            return torch.device(only)
    return None


class WrapAudit:
    """Runs the model audit at a wrap and announces what it finds (each message once per rank)."""

    def __init__(self, announce: Announcer) -> None:
        self.announce = announce
        self._owners_reported_by_fully_shard = False

    def audit(self, model: Any, *, wrapper: str, device: Any = None, tensors: bool) -> None:
        import torch

        from .device_placement import audit_model

        if not isinstance(model, torch.nn.Module):
            return
        for finding in audit_model(model, device=device, tensors=tensors, agreeing_hooks=False):
            self.report(finding, wrapper=wrapper)

    def report(self, finding: Finding, *, wrapper: str) -> None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else None
        self.announce(_with_wrap_site(finding, wrapper, _user_line(), rank), rank)

    def fully_shard(self, model: Any) -> None:
        # fully_shard is called per block, bottom-up: the blocks' owners are reported once, not per block
        if self._owners_reported_by_fully_shard:
            return
        modules = model if isinstance(model, (list, tuple)) else [model]
        before = len(self.announce.said)
        for module in modules:
            self.audit(module, wrapper="fully_shard", tensors=False)
        self._owners_reported_by_fully_shard = len(self.announce.said) > before


def _with_wrap_site(
    finding: Finding, wrapper: str, site: tuple[str, int] | None, rank: int | None
) -> Finding:
    where = f"{site[0]}:{site[1]}" if site else "a library's call"
    locations = finding.locations
    if site is not None:
        locations = (*locations, Location(site[0], site[1], rank=rank))
    return dataclasses.replace(
        finding,
        locations=locations,
        evidence=(
            *finding.evidence,
            Evidence(f"found when `{wrapper}` wrapped the model, called from {where}", rank=rank),
        ),
        facts={**finding.facts, "wrapped_by": wrapper, "wrap_site": where},
    )


# Wraps of one kind in progress on this thread: FSDP's auto-wrap constructs an FSDP per block inside the
# root's
# constructor, and the root's audit has seen those blocks already.
_inside = threading.local()


def _before(original: Callable[..., Any], run: Callable[[tuple[Any, ...], dict[str, Any]], None]) -> Any:
    """`original` with `run(args, kwargs)` first, unless a wrap of the same kind is in progress; `run` failing
    is one debug line."""
    kind = getattr(original, "__qualname__", repr(original))

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        active: set[str] = _inside.__dict__.setdefault("kinds", set())
        if kind in active:
            return original(*args, **kwargs)
        with failsafe(f"wrapping: auditing the model at {kind}"):
            run(args, kwargs)
        active.add(kind)
        try:
            return original(*args, **kwargs)
        finally:
            active.discard(kind)

    return wrapped


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], position: int, name: str) -> Any:
    return args[position] if len(args) > position else kwargs.get(name)


def install_wrap_audit(report: Callable[[Finding], None]) -> Uninstall:
    """Patch the wrappers this process has imported (see the module's doc)."""
    import torch.nn.parallel

    audit = WrapAudit(Announcer(report))
    removers: list[Uninstall] = []

    def ddp(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # args[0] is the DDP object under construction
        module, device_ids = _argument(args, kwargs, 1, "module"), _argument(args, kwargs, 2, "device_ids")
        refused = refused_device_ids(module, device_ids)
        if refused is not None:  # DDP's own error is the failure: no placement judged against device_ids
            audit.report(refused, wrapper="DistributedDataParallel")
            return
        audit.audit(_argument(args, kwargs, 1, "module"), wrapper="DistributedDataParallel",
                    device=_device_of(_argument(args, kwargs, 2, "device_ids")), tensors=True)

    removers.append(patch(torch.nn.parallel.DistributedDataParallel, "__init__", lambda f: _before(f, ddp)))

    fsdp = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp is not None:
        def fsdp1(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            audit.audit(
                _argument(args, kwargs, 1, "module"), wrapper="FullyShardedDataParallel", tensors=False
            )

        removers.append(patch(fsdp.FullyShardedDataParallel, "__init__", lambda f: _before(f, fsdp1)))

    fully_shard_module = sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard")
    if fully_shard_module is not None:
        def fsdp2(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if len(args) > 1 and args[1] == "fully_shard":
                audit.fully_shard(args[0])

        removers.append(patch(fully_shard_module, "_validate_module", lambda f: _before(f, fsdp2)))

    accelerator = sys.modules.get("accelerate.accelerator")
    if accelerator is not None and hasattr(accelerator, "Accelerator"):
        def prepare_model(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            audit.audit(_argument(args, kwargs, 1, "model"), wrapper="accelerator.prepare",
                        device=getattr(args[0], "device", None), tensors=False)

        removers.append(patch(accelerator.Accelerator, "prepare_model", lambda f: _before(f, prepare_model)))
    return all_of(removers)
