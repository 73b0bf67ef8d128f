"""F3 foreign-device-hooks (and F1): parameters and buffers that are not on the rank's device, modules whose
placement accelerate (`_hf_hook`, `hf_device_map`) or bitsandbytes owns, and inputs that reach a module on
another device. Findings are grouped by module prefix, so one misplaced submodule of 10,000 tensors is one
finding."""

from __future__ import annotations

import inspect
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ddpdoctor.findings import Evidence, Finding, Fix, Location, Severity

from .job import AuditWarning, group_has_cpu_backend, in_distributed_job, rank_device, same_device

# More groups than this become one summary finding: a report is read by a person.
MAX_GROUPS = 8
# Paths listed per hook finding before "... and N more".
MAX_PATHS_SHOWN = 6

_BNB_NAMES = frozenset(
    {
        "Linear8bitLt",
        "Linear4bit",
        "LinearFP4",
        "LinearNF4",
        "Embedding8bit",
        "Embedding4bit",
        "EmbeddingFP4",
        "EmbeddingNF4",
        "Params4bit",
        "Int8Params",
    }
)
# Packages whose classes are never the place a user should be sent to.
_LIBRARY_PREFIXES = (
    "torch",
    "lightning",
    "pytorch_lightning",
    "accelerate",
    "transformers",
    "peft",
    "bitsandbytes",
)


def _majority_device(tensors: Iterable[tuple[str, str, torch.Tensor]]) -> torch.device | None:
    weight: Counter[torch.device] = Counter()
    for _, _, tensor in tensors:
        weight[tensor.device] += max(tensor.numel(), 1)
    return weight.most_common(1)[0][0] if weight else None


def _expected_device(model: nn.Module, device: torch.device | str | int | None) -> torch.device:
    if device is not None:
        if isinstance(device, int):
            return torch.device("cuda", device)
        given = torch.device(device)
        # accelerate's `cpu:0` and torch's `cpu` are one device: the same finding reads the same
        return torch.device("cpu") if given.type == "cpu" else given
    if in_distributed_job() and group_has_cpu_backend() is not True:
        return rank_device()
    # Outside a job there is no "rank's device", nor in a gloo group (CPU training on a GPU machine is
    # legitimate): judge the odd tensors against where most of the model is.
    return _majority_device(_tensors(model)) or rank_device()


# ------------------------------------------------------------------------------------------ the model


def _tensors(model: nn.Module) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(owner module path, full tensor name, tensor) for every parameter and buffer, shared ones once."""
    seen: set[int] = set()
    for module_path, module in model.named_modules():
        named = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        for name, tensor in named:
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            yield module_path, _join(module_path, name), tensor


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _ancestors(path: str) -> list[str]:
    """'' (the root) first, then each prefix of `path`, ending with `path` itself."""
    if not path:
        return [""]
    parts = path.split(".")
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def _shown(path: str) -> str:
    return f"`{path}`" if path else "the whole model"


def _class_location(model: nn.Module, module_path: str) -> Location | None:
    """The definition of the nearest user-defined class on the way from `module_path` up to the root."""
    modules = dict(model.named_modules())
    for path in reversed(_ancestors(module_path)):
        module = modules.get(path)
        if module is None:
            continue
        cls = type(module)
        if cls.__module__.split(".")[0] in _LIBRARY_PREFIXES:
            continue
        try:
            source = inspect.getsourcefile(cls)
            _, line = inspect.getsourcelines(cls)
        except (OSError, TypeError):
            continue
        if source:
            return Location(path=source, line=line)
    return None


@dataclass
class _HookSite:
    module: str
    owner: str  # "accelerate" or "bitsandbytes"
    description: str
    devices: tuple[torch.device, ...]  # devices the hook moves things to (accelerate's execution device)
    offload: bool = False


def _accelerate_hooks(hook: Any) -> list[Any]:
    inner = getattr(hook, "hooks", None)  # accelerate's SequentialHook
    if isinstance(inner, (list, tuple)):
        return [h for sub in inner for h in _accelerate_hooks(sub)]
    return [hook]


def _describe_accelerate(hook: Any) -> tuple[str, tuple[torch.device, ...], bool]:
    name = type(hook).__name__
    details: list[str] = []
    devices: list[torch.device] = []
    execution = getattr(hook, "execution_device", None)
    if execution is not None:
        try:
            device = (
                torch.device(execution) if not isinstance(execution, int) else torch.device("cuda", execution)
            )
        except (RuntimeError, TypeError):
            device = None
        if device is not None:
            devices.append(device)
        details.append(f"execution_device={execution}")
    offload = bool(getattr(hook, "offload", False))
    if offload:
        details.append("offload=True")
    if getattr(hook, "io_same_device", False):
        details.append("io_same_device=True")
    return f"{name}({', '.join(details)})", tuple(devices), offload


def _is_bitsandbytes(obj: Any) -> bool:
    for cls in type(obj).__mro__:
        if cls.__module__.split(".")[0] == "bitsandbytes" or cls.__name__ in _BNB_NAMES:
            return True
    return False


def _hook_sites(model: nn.Module) -> list[_HookSite]:
    sites: list[_HookSite] = []
    for path, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        if hook is not None:
            for single in _accelerate_hooks(hook):
                description, devices, offload = _describe_accelerate(single)
                sites.append(_HookSite(path, "accelerate", description, devices, offload))
        bnb_params = [type(p).__name__ for p in module.parameters(recurse=False) if _is_bitsandbytes(p)]
        if _is_bitsandbytes(module) or bnb_params:
            kinds = sorted({type(module).__name__, *bnb_params} - {"Module"})
            sites.append(_HookSite(path, "bitsandbytes", " / ".join(kinds), ()))
    return sites


def _collapse_map(paths: Iterable[str], limit: int) -> dict[str, str]:
    """Map each module path to a label so that at most `limit` labels remain; `layers.*` stands for
    everything under `layers`. The deepest paths are lifted to their parent first."""
    label = {path: path for path in paths}

    def concrete(text: str) -> list[str]:
        return [part for part in text.split(".") if part and part != "*"]

    while len(set(label.values())) > limit:
        depth = max(len(concrete(v)) for v in label.values())
        if depth == 0:
            break
        for path, current in label.items():
            parts = concrete(current)
            if len(parts) == depth:
                parent = ".".join(parts[:-1])
                label[path] = f"{parent}.*" if parent else "*"
    return label


def _collapse(paths: list[str], limit: int = MAX_PATHS_SHOWN) -> list[tuple[str, int]]:
    """Shorten a list of module paths to at most `limit` labels with their counts."""
    labels = _collapse_map(set(paths), limit)
    counts: Counter[str] = Counter(labels[p] for p in paths)
    return sorted(counts.items())


def _paths_text(paths: list[str]) -> str:
    shown = []
    for prefix, count in _collapse(paths):
        label = f"`{prefix}`" if prefix else "`<root>`"
        shown.append(f"{label} ({count} modules)" if count > 1 else label)
    return ", ".join(shown)


def _placing_hooks(sites: list[_HookSite], expected: torch.device, agreeing_hooks: bool) -> list[_HookSite]:
    accelerate = [s for s in sites if s.owner == "accelerate"]
    if not agreeing_hooks:
        # hooks that move to this rank's device only, with nothing offloaded, are what the fix leaves
        # (`device_map={"": local_rank}`): one owner in effect
        accelerate = [
            s for s in accelerate if s.offload or any(not same_device(d, expected) for d in s.devices)
        ]
    return accelerate


def _foreign_device_map(model: nn.Module, expected: torch.device) -> dict[str, str]:
    """The entries of the model's `hf_device_map` that send a module anywhere but the rank's device."""
    device_map = getattr(model, "hf_device_map", None)
    foreign_map: dict[str, str] = {}
    if isinstance(device_map, dict):
        for key, value in device_map.items():
            try:
                target = torch.device(value) if not isinstance(value, int) else torch.device("cuda", value)
            except (RuntimeError, TypeError):
                foreign_map[str(key)] = str(value)  # "disk" and friends
                continue
            if not same_device(target, expected):
                foreign_map[str(key)] = str(value)
    return foreign_map


def _accelerate_evidence(
    accelerate: list[_HookSite], foreign_map: dict[str, str], expected: torch.device
) -> list[Evidence]:
    by_description: dict[str, list[str]] = defaultdict(list)
    for site in accelerate:
        by_description[site.description].append(site.module)
    evidence = [
        Evidence(f"{desc} on {_paths_text(paths)}") for desc, paths in sorted(by_description.items())
    ]
    if foreign_map:
        sample = ", ".join(
            f"{k or '<root>'}: {v}" for k, v in list(foreign_map.items())[:MAX_PATHS_SHOWN]
        )
        more = len(foreign_map) - MAX_PATHS_SHOWN
        evidence.append(
            Evidence(
                f"model.hf_device_map sends {len(foreign_map)} "
                f"{'entry' if len(foreign_map) == 1 else 'entries'} off {expected}: {sample}"
                + (f", ... and {more} more" if more > 0 else "")
            )
        )
    return evidence


def _accelerate_finding(
    model: nn.Module,
    accelerate: list[_HookSite],
    foreign_map: dict[str, str],
    expected: torch.device,
    misplaced_under: dict[str, int],
) -> Finding:
    """accelerate's hooks or an `hf_device_map` placing modules while the DDP strategy places them too."""
    elsewhere = sorted(
        {str(d) for s in accelerate for d in s.devices if not same_device(d, expected)}
        | set(foreign_map.values())
    )
    modules = sorted({s.module for s in accelerate})
    offloaded = sum(misplaced_under.get(m, 0) for m in modules)
    parts = [f"accelerate places {len(modules)} module(s) itself"] if modules else []
    if foreign_map:
        parts.append("the model carries an `hf_device_map`")
    message = " and ".join(parts) + f" while this rank's device is {expected}"
    if elsewhere:
        message += f"; they move weights or inputs to {', '.join(elsewhere)}"
    if offloaded:
        message += (
            f"; {offloaded} tensor(s) under these modules are not on {expected} "
            "(accelerate moves them at forward)"
        )
    message += (
        ". Two owners of device placement: under DDP this is `Expected all tensors to be on the same device` "
        "on rank 1 and above."
    )
    return Finding(
        class_="foreign-device-hooks",
        message=message,
        severity=Severity.ERROR if elsewhere else Severity.WARNING,
        locations=_optional(_class_location(model, modules[0] if modules else "")),
        fix=Fix(
            'Give placement one owner: load with `device_map={"": local_rank}` (or no device_map) when '
            "training with DDP, or remove the hooks with "
            "`accelerate.hooks.remove_hook_from_submodules(model)` before the strategy moves the model."
        ),
        evidence=tuple(_accelerate_evidence(accelerate, foreign_map, expected)),
        facts={
            "rank_device": str(expected),
            "hooks": [
                {"module": s.module, "hook": s.description, "offload": s.offload}
                for s in accelerate[:200]
            ],
            "hf_device_map": {k: str(v) for k, v in foreign_map.items()},
            "foreign_devices": elsewhere,
        },
    )


def _bitsandbytes_finding(
    model: nn.Module, bnb: list[_HookSite], expected: torch.device, misplaced_under: dict[str, int]
) -> Finding:
    """Quantized layers, whose weights bitsandbytes and accelerate move, not the DDP strategy."""
    kinds = Counter(s.description for s in bnb)
    misplaced = sum(misplaced_under.get(m, 0) for m in {s.module for s in bnb})
    message = (
        f"bitsandbytes layers in {len(bnb)} module(s) "
        f"({', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))}): "
        f"their quantized weights are moved by bitsandbytes on `.to()`/`.cuda()` and by accelerate at load, "
        f"not by the DDP strategy"
    )
    if misplaced:
        message += f"; {misplaced} of their tensors are not on {expected}"
    return Finding(
        class_="foreign-device-hooks",
        message=message + ".",
        severity=Severity.ERROR if misplaced else Severity.WARNING,
        locations=_optional(_class_location(model, bnb[0].module)),
        fix=Fix(
            'Load quantized models with `device_map={"": local_rank}` on each rank; drop 8-/4-bit loading '
            "where it is not needed for memory."
        ),
        evidence=(
            Evidence(f"{' / '.join(sorted(kinds))} on {_paths_text([s.module for s in bnb])}"),
        ),
        facts={"rank_device": str(expected), "modules": [s.module for s in bnb[:200]]},
    )


def _hook_findings(
    model: nn.Module,
    sites: list[_HookSite],
    expected: torch.device,
    misplaced_under: dict[str, int],
    agreeing_hooks: bool = True,
) -> list[Finding]:
    findings: list[Finding] = []
    accelerate = _placing_hooks(sites, expected, agreeing_hooks)
    foreign_map = _foreign_device_map(model, expected)
    if accelerate or foreign_map:
        findings.append(_accelerate_finding(model, accelerate, foreign_map, expected, misplaced_under))
    bnb = [s for s in sites if s.owner == "bitsandbytes"]
    if bnb:
        findings.append(_bitsandbytes_finding(model, bnb, expected, misplaced_under))
    return findings


def _optional(location: Location | None) -> tuple[Location, ...]:
    return (location,) if location is not None else ()


@dataclass
class _TensorGroup:
    module: str  # a module path, a tensor name, or a collapsed label such as `layers.*`
    device: torch.device
    names: list[str] = field(default_factory=list)
    numel: int = 0
    whole: bool = True  # False once collapsed: the label's subtree also holds well-placed tensors
    parts: list[str] = field(default_factory=list)  # the groups a collapsed one stands for


def audit_model(
    model: nn.Module,
    device: torch.device | str | int | None = None,
    *,
    tensors: bool = True,
    agreeing_hooks: bool = True,
) -> list[Finding]:
    """Parameters and buffers that are not on the rank's device, and modules whose placement others own.

    `device` defaults to `cuda:LOCAL_RANK` (CPU without CUDA) inside a distributed job, and to the device
    holding most of the model's elements outside one. Misplaced tensors are grouped by the largest module
    that is entirely on the same wrong device; tensors under an accelerate or bitsandbytes module are
    reported with that module's finding instead.

    `tensors=False` judges the placement owners only (hooks, `hf_device_map`, bitsandbytes): for a wrapper
    that moves the tensors itself (FSDP, `accelerator.prepare`). `agreeing_hooks=False` leaves out accelerate
    hooks that move to the rank's own device and offload nothing, which is what the fix leaves behind.
    """
    expected = _expected_device(model, device)
    sites = _hook_sites(model)
    groups, misplaced_under = _misplaced_groups(model, sites, expected)
    findings = _hook_findings(model, sites, expected, misplaced_under, agreeing_hooks)
    if not tensors:
        return findings
    ordered = sorted(_regroup(groups), key=lambda g: (-g.numel, g.module))
    shown, rest = (
        (ordered, [])
        if len(ordered) <= MAX_GROUPS
        else (ordered[: MAX_GROUPS - 1], ordered[MAX_GROUPS - 1 :])
    )
    for group in shown:
        findings.append(_misplaced_finding(model, group, expected))
    if rest:
        findings.append(_more_misplaced_finding(rest, expected))
    return findings


def _misplaced_groups(
    model: nn.Module, sites: list[_HookSite], expected: torch.device
) -> tuple[list[_TensorGroup], Counter[str]]:
    """The tensors off the rank's device, grouped by module, and how many of them lie under each module
    whose placement accelerate or bitsandbytes owns (counted there, not grouped)."""
    owned = list(_tensors(model))
    hooked = {s.module for s in sites if s.owner == "accelerate" and (s.offload or s.devices)}
    hooked |= {s.module for s in sites if s.owner == "bitsandbytes"}

    # Which devices each module's subtree holds: a group is the shallowest ancestor wholly on one device.
    subtree_devices: dict[str, set[torch.device]] = defaultdict(set)
    for owner, _, tensor in owned:
        for prefix in _ancestors(owner):
            subtree_devices[prefix].add(tensor.device)

    groups: dict[tuple[str, torch.device], _TensorGroup] = {}
    misplaced_under: Counter[str] = Counter()
    for owner, name, tensor in owned:
        if same_device(tensor.device, expected):
            continue
        chain = _ancestors(owner)
        hook_owner = next((p for p in chain if p in hooked), None)
        if hook_owner is not None:
            misplaced_under[hook_owner] += 1
            continue
        root = next((p for p in chain if subtree_devices[p] == {tensor.device}), name)
        group = groups.setdefault((root, tensor.device), _TensorGroup(root, tensor.device))
        group.names.append(name)
        group.numel += tensor.numel()
    return list(groups.values()), misplaced_under


def _more_misplaced_finding(rest: list[_TensorGroup], expected: torch.device) -> Finding:
    """One finding for the groups past the first MAX_GROUPS - 1, so a scattered model is not a wall."""
    count = sum(len(g.names) for g in rest)
    return Finding(
        class_="foreign-device-hooks",
        message=(
            f"{count} more tensor(s) in {len(rest)} other module group(s) are not on {expected}: "
            + ", ".join(f"{_shown(g.module)} on {g.device}" for g in rest[:MAX_PATHS_SHOWN])
            + (", ..." if len(rest) > MAX_PATHS_SHOWN else "")
        ),
        severity=Severity.ERROR,
        fix=_misplaced_fix(expected),
        facts={
            "rank_device": str(expected),
            "groups": [
                {"module": g.module, "device": str(g.device), "tensors": len(g.names)} for g in rest
            ],
        },
    )


def _regroup(groups: list[_TensorGroup]) -> list[_TensorGroup]:
    """Merge scattered groups (every layer's bias, ...) of one device under collapsed labels."""
    if len(groups) <= MAX_GROUPS:
        return groups
    merged: list[_TensorGroup] = []
    for device in sorted({g.device for g in groups}, key=str):
        same = [g for g in groups if g.device == device]
        labels = _collapse_map({g.module for g in same}, MAX_GROUPS)
        members: dict[str, list[_TensorGroup]] = defaultdict(list)
        for group in same:
            members[labels[group.module]].append(group)
        for label, parts in members.items():
            if len(parts) == 1:
                merged.append(parts[0])
                continue
            prefix = label.removesuffix("*").removesuffix(".")
            target = _TensorGroup(prefix, device, whole=False)
            for part in parts:
                target.names += part.names
                target.numel += part.numel
                target.parts.append(part.module)
            merged.append(target)
    return merged


def _misplaced_fix(expected: torch.device) -> Fix:
    return Fix(
        f"Move the module to the rank's device before training (`model.to({str(expected)!r})`, or let the "
        "strategy do it), including modules added after loading such as LoRA adapters; in a LightningModule "
        'never hard-code `.cuda()`/`"cuda:0"`, use `self.device`.'
    )


def _misplaced_finding(model: nn.Module, group: _TensorGroup, expected: torch.device) -> Finding:
    # A CPU tensor in a GPU job fails in DDP's broadcast/all_reduce before it fails anywhere else (F1), on a
    # group with no CPU backend (NCCL alone); a gloo group runs it, and the forward pass is what fails.
    cpu_in_gpu_job = (
        group.device.type == "cpu" and expected.type != "cpu" and group_has_cpu_backend() is not True
    )
    slug = "backend-device-mismatch" if cpu_in_gpu_job else "foreign-device-hooks"
    what = f"{len(group.names)} tensor(s), {group.numel:,} elements"
    if group.module in group.names:
        message = f"`{group.module}` is on {group.device}"
    elif group.whole:
        message = f"{_shown(group.module)} ({what}) is on {group.device}"
    else:
        where = f"under `{group.module}`" if group.module else "across the model"
        places = ", ".join(f"`{p}`" for p in group.parts[:3]) + (", ..." if len(group.parts) > 3 else "")
        message = f"{what} in {len(group.parts)} places {where} ({places}) are on {group.device}"
    message += f", not on this rank's device {expected}"
    if cpu_in_gpu_job:
        message += (
            "; DDP's parameter broadcast (or a library's all_reduce) of CPU tensors fails with "
            "`No backend type associated with device type cpu` on an NCCL group"
        )
    elif group.device.type == "meta":
        message += (
            "; the meta device holds no data: materialise it (`module.to_empty(device=...)` and "
            "`reset_parameters()`, or `load_state_dict(..., assign=True)`) before the model is wrapped or run"
        )
    elif group.device.type == expected.type:
        message += "; the forward pass fails with `Expected all tensors to be on the same device`"
    examples = group.names[:MAX_PATHS_SHOWN]
    evidence = Evidence(
        "tensors: "
        + ", ".join(examples)
        + (f", ... and {len(group.names) - len(examples)} more" if len(group.names) > len(examples) else "")
    )
    return Finding(
        class_=slug,
        message=message + ".",
        severity=Severity.ERROR,
        locations=_optional(_class_location(model, group.module)),
        fix=_misplaced_fix(expected),
        evidence=(evidence,),
        facts={
            "module": group.module,
            "device": str(group.device),
            "rank_device": str(expected),
            "tensors": len(group.names),
            "elements": group.numel,
        },
    )


# ----------------------------------------------------------------------------------- forward check


class ForwardDeviceCheck:
    """Forward pre-hooks that name the first module whose inputs and own weights are on different devices.

    Returned by `audit_forward`; use as a context manager or call `remove()`. Findings accumulate in
    `findings` (one per module); the first one is also emitted as an `AuditWarning`. Modules placed by an
    accelerate hook are skipped: the hook moves inputs and weights after the pre-hook runs.
    """

    def __init__(self, model: nn.Module) -> None:
        self.findings: list[Finding] = []
        self._flagged: set[str] = set()
        self._handles = [
            module.register_forward_pre_hook(self._pre_hook(path, module), with_kwargs=True)
            for path, module in model.named_modules()
            if getattr(module, "_hf_hook", None) is None
        ]

    def _pre_hook(self, path: str, module: nn.Module) -> Any:
        def check(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if path in self._flagged:
                return
            own = [t for _, t in module.named_parameters(recurse=False)] + [
                t for _, t in module.named_buffers(recurse=False) if t is not None
            ]
            if not own:
                return
            inputs = list(_input_tensors(args)) + list(_input_tensors(kwargs.values()))
            weight_devices = {t.device for t in own}
            for name, tensor in inputs:
                if not any(same_device(tensor.device, d) for d in weight_devices):
                    self._flag(path, module, name, tensor, sorted(weight_devices, key=str))
                    return

        return check

    def _flag(
        self, path: str, module: nn.Module, name: str, tensor: torch.Tensor, devices: list[torch.device]
    ) -> None:
        self._flagged.add(path)
        weights = ", ".join(str(d) for d in devices)
        finding = Finding(
            class_="foreign-device-hooks",
            message=(
                f"module {_shown(path)} ({type(module).__name__}) receives {name} on {tensor.device} "
                f"(shape {list(tensor.shape)}) while its weights are on {weights}: this is where "
                "`Expected all tensors to be on the same device` comes from"
            ),
            severity=Severity.ERROR,
            fix=Fix(
                "Move inputs with the module's device (`x.to(self.device)` in a LightningModule) and give "
                "weight placement one owner (no accelerate device_map / hooks next to a DDP strategy)."
            ),
            facts={
                "module": path,
                "input_device": str(tensor.device),
                "weight_devices": [str(d) for d in devices],
            },
        )
        self.findings.append(finding)
        if len(self.findings) == 1:
            warnings.warn(f"ddpdoctor: {finding.message}", AuditWarning, stacklevel=4)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> ForwardDeviceCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _input_tensors(values: Iterable[Any], prefix: str = "input") -> Iterator[tuple[str, torch.Tensor]]:
    for index, value in enumerate(values):
        label = f"{prefix} {index}"
        if isinstance(value, torch.Tensor):
            yield label, value
        elif isinstance(value, (list, tuple)):
            yield from _input_tensors(value, label)
        elif isinstance(value, dict):
            yield from _input_tensors(value.values(), label)


def audit_forward(model: nn.Module) -> ForwardDeviceCheck:
    """Watch forward passes of `model`; see `ForwardDeviceCheck`."""
    return ForwardDeviceCheck(model)


