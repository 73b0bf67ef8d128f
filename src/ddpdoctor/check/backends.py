"""Which backends an `init_process_group` call registers: the value of its `backend`, followed in one file.

The value is followed through literals, names bound in the file, argparse defaults (`args.dist_backend`
with `add_argument("--dist-backend", default="nccl")`), dict literals holding the key (`cfg["backend"]`),
`os.environ.get("BACKEND", "nccl")`, conditional expressions and parameters (the value-flow core's join of
the default and the file's calls, `values.py`). A call without a backend (or with only
`init_method`) creates, since torch 2.6, the backend of the host's accelerator alone: NCCL on a CUDA host,
gloo on a CPU-only one (`BackendConfig.__init__` in torch/distributed/distributed_c10d.py, the
`Backend.UNDEFINED` case) — so on a GPU cluster it is NCCL-only, which the finding says with a hedge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .source import dotted, keyword, statements, walk

if TYPE_CHECKING:
    from .project import BackendInit
    from .source import SourceFile

MAX_DEPTH = 4


@dataclass(frozen=True)
class Value:
    text: str | None  # None: unknown
    how: str  # where it came from, for the message


def cuda_only(value: str) -> bool:
    """A backend string that registers backends for `cuda` only: `"nccl"`, `"cuda:nccl"`, or `"cuda:gloo"`
    (the CPU stand-in for NCCL)."""
    value = value.strip().lower()
    if value == "nccl":
        return True
    parts = [part.split(":", 1) for part in value.split(",")]
    return all(len(part) == 2 and part[0].strip() == "cuda" for part in parts)


class BackendValues:
    def __init__(self, source: SourceFile):
        self.source = source
        self._assignments: dict[str, list[ast.expr]] | None = None
        self._dicts: list[ast.Dict] | None = None  # the file's dict displays, walked once for every key

    @property
    def assignments(self) -> dict[str, list[ast.expr]]:
        if self._assignments is None:
            found: dict[str, list[ast.expr]] = {}
            for node in statements(self.source.tree.body):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        name = dotted(target)
                        if name:
                            found.setdefault(name, []).append(node.value)
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    name = dotted(node.target)
                    if name:
                        found.setdefault(name, []).append(node.value)
            self._assignments = found
        return self._assignments

    def values(self, node: ast.expr, depth: int = 0) -> list[Value]:
        if depth > MAX_DEPTH:
            return [Value(None, "")]
        if isinstance(node, ast.Constant):
            return [Value(node.value if isinstance(node.value, str) else None, "")]
        if isinstance(node, ast.IfExp):
            return self.values(node.body, depth + 1) + self.values(node.orelse, depth + 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "get", "getenv") and len(node.args) >= 2:
            return [Value(None, ""), *self._with(self.values(node.args[1], depth + 1),
                                                 f"the default of `{self.source.segment(node)}`")]
        name = dotted(node)
        if name is None:
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                    node.slice.value, str):
                return self._dict_values(node.slice.value) or [Value(None, "")]
            return [Value(None, "")]
        bound = self.assignments.get(name)
        if bound:
            found: list[Value] = []
            for value in bound:
                found += self.values(value, depth + 1)
            return found
        if isinstance(node, ast.Attribute):
            return self._argparse(node.attr) or [Value(None, "")]
        if isinstance(node, ast.Name):
            return self._parameter(node)
        return [Value(None, "")]

    def _parameter(self, node: ast.Name) -> list[Value]:
        """`init_process_group(backend=backend)` in `def setup(backend="nccl")`: the value-flow core's
        answer for the parameter, its default joined with what the file's calls pass (through helpers
        that hand it on: `init_dist(launcher, backend="nccl")` → `_init_pytorch(backend)`); callers in
        other files are not read, so a default alone is a hedge (`Value(None, why)`)."""
        from .values import Opaque, scope_of_calls  # the core imports the rank domain, loaded on demand

        scope = scope_of_calls(self.source)(node)
        bound = scope.at(node).get(node.id, frozenset())
        if not bound or not all(b.parameter is not None for b in bound):
            return [Value(None, "")]
        consts = scope.constants(node)
        function = scope.function
        where = f"the parameter `{node.id}` of `{function.name}()`" if function else f"`{node.id}`"
        found = [Value(v, where) if isinstance(v, str) else Value(None, "")
                 for v in consts.values if not isinstance(v, Opaque)]
        if consts.unknown or len(found) < len(consts.values):
            found.append(Value(None, consts.unknown))
        return found or [Value(None, "")]

    @staticmethod
    def _with(values: list[Value], how: str) -> list[Value]:
        return [Value(v.text, v.how or how) for v in values]

    def _argparse(self, attribute: str) -> list[Value]:
        """`args.dist_backend`: the `default=` of the option whose destination it is."""
        found: list[Value] = []
        for call in self.source.calls:
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
                continue
            dest = keyword(call, "dest")
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            dests = {dest.value.value} if dest and isinstance(dest.value, ast.Constant) else {
                n.lstrip("-").replace("-", "_") for n in names if n.startswith("--")} or {
                n.replace("-", "_") for n in names}
            if attribute not in dests:
                continue
            default = keyword(call, "default")
            if default is not None and isinstance(default.value, ast.Constant) and isinstance(
                    default.value.value, str):
                found.append(
                    Value(
                        default.value.value,
                        f"the argparse default of `{names[0] if names else attribute}` (line {call.lineno})",
                    )
                )
            else:
                found.append(Value(None, ""))
        return found

    def _dict_values(self, key: str) -> list[Value]:
        if self._dicts is None:
            self._dicts = [node for node in walk(self.source.tree) if node.__class__ is ast.Dict  # type: ignore[misc]
                           ] if "{" in self.source.text else []
        found: list[Value] = []
        for node in self._dicts:
            for k, v in zip(node.keys, node.values, strict=False):
                if (
                    isinstance(k, ast.Constant)
                    and k.value == key
                    and isinstance(v, ast.Constant)
                    and isinstance(v.value, str)
                ):
                    found.append(
                        Value(v.value, f"the config value `{key!r}: {v.value!r}` (line {v.lineno})")
                    )
        return found


# Frameworks that create the default group themselves, and what they create on a CUDA host.
# accelerate: `PartialState.__init__` picks backend "nccl" for several CUDA GPUs unless an
# `InitProcessGroupKwargs(backend=...)` handler says otherwise (accelerate/state.py, 1.15).
ACCELERATE_STATES = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator",
                               "accelerate.PartialState", "accelerate.state.PartialState",
                               "accelerate.AcceleratorState", "accelerate.state.AcceleratorState"})
# Lightning: `DDPStrategy._get_process_group_backend` (and FSDP's, DeepSpeed's) falls back to
# `torch.distributed.Backend.default_device_backend_map[device.type]`, "nccl" for cuda
# (lightning/fabric/utilities/distributed.py, 2.6), unless `process_group_backend=` is given.
LIGHTNING_LAUNCHERS = frozenset({"lightning.pytorch.Trainer", "lightning.Trainer", "lightning.fabric.Fabric",
                                 "lightning.Fabric", "lightning.pytorch.trainer.trainer.Trainer"})
DISTRIBUTED_STRATEGIES = ("ddp", "fsdp", "deepspeed")
FRAMEWORK_WORDS = ("Accelerator", "PartialState", "AcceleratorState", "Trainer", "Fabric")


@dataclass(frozen=True)
class FrameworkInit:
    """A framework's function that creates the default group itself: where its backend argument may be
    (keyword, and the positions it has had across the library's versions) and what it creates without one."""

    keyword: str
    positions: tuple[int, ...]
    default: str  # words for the message
    hedged: bool  # the default depends on the host (the accelerator's backend)


# DeepSpeed: `init_distributed(dist_backend=None)` takes `get_accelerator().communication_backend_name()`,
# `"nccl"` for `CUDA_Accelerator` (deepspeed/comm/comm.py, deepspeed/accelerator/cuda_accelerator.py; gloo
# on Windows, ccl on XPU), and hands it to `init_process_group` unless a group already exists.
_DEEPSPEED = FrameworkInit("dist_backend", (0,), "DeepSpeed's default: the accelerator's backend, `nccl` on "
                           "a CUDA host (`get_accelerator().communication_backend_name()`)", True)
# Colossal-AI: `launch(..., backend="nccl")` calls `init_process_group(backend=backend)`; the `launch_from_*`
# wrappers default to `"nccl"` too and pass it on (colossalai/initialize.py; the config parameter that led
# the signatures was dropped later, so the backend has been at either position).
_COLOSSAL = {"launch": (4, 5), "launch_from_torch": (0, 1), "launch_from_slurm": (2, 3),
             "launch_from_openmpi": (2, 3)}
# `deepspeed.initialize(...)` makes the group itself when none exists: `init_distributed(dist_backend=
# get_accelerator().communication_backend_name(), ...)` (deepspeed/__init__.py); `dist_init_required=False`
# says the program made it. (A group another file makes comes first: DDP301 drops this one then.)
ENGINE_INIT = "`deepspeed.initialize`"
_DEEPSPEED_ENGINE = FrameworkInit("", (), f"{ENGINE_INIT} with no group made before it: DeepSpeed makes one "
                                  "with the accelerator's backend, `nccl` on a CUDA host", True)
FRAMEWORK_INITS: dict[str, FrameworkInit] = {
    **{f"{package}.init_distributed": _DEEPSPEED
       for package in ("deepspeed", "deepspeed.comm", "deepspeed.comm.comm")},
    "deepspeed.initialize": _DEEPSPEED_ENGINE,
    **{f"{package}.{name}": FrameworkInit("backend", positions, "Colossal-AI's default backend `nccl`", False)
       for package in ("colossalai", "colossalai.initialize") for name, positions in _COLOSSAL.items()},
}
FRAMEWORK_INIT_WORDS = ("init_distributed", "colossalai", "deepspeed")
_BACKEND_NAMES = ("nccl", "gloo", "mpi", "ucc", "hccl", "ccl", "xccl")


def nccl_inits(source: SourceFile) -> Iterator[BackendInit]:
    """The calls of a file that create a default group with backends for CUDA only (or may): its
    `init_process_group` calls, DeepSpeed's and Colossal-AI's initialisers, and accelerate's and Lightning's
    set-ups where the file shows them."""
    from .project import BackendInit

    text = source.text
    if "init_process_group" in text:
        yield from _torch_inits(source)
    elif any(word in text for word in FRAMEWORK_INIT_WORDS):
        yield from _framework_inits(source)  # a group the file makes itself comes first: it is not remade
    if any(word in text for word in FRAMEWORK_WORDS):
        for call in source.calls:
            qual = source.resolve(call.func) or ""
            how = _accelerate(call) if qual in ACCELERATE_STATES else (
                _lightning(call) if qual in LIGHTNING_LAUNCHERS else None)
            if how is not None:
                yield BackendInit(source.path, call.lineno, how[0], hedged=how[1])


def _framework_inits(source: SourceFile) -> Iterator[BackendInit]:
    """`deepspeed.init_distributed()`, `colossalai.launch_from_torch(...)`: the backend argument followed like
    `init_process_group`'s, the framework's default where none is given (`FRAMEWORK_INITS`)."""
    from .project import BackendInit

    values = BackendValues(source)
    called = [(call, FRAMEWORK_INITS[qual]) for call in source.calls
              if (qual := source.resolve(call.func) or "") in FRAMEWORK_INITS]
    makes = any(known.keyword for _, known in called)  # `initialize` after `init_distributed` makes nothing
    for call, known in called:
        if makes and not known.keyword:
            continue
        required = keyword(call, "dist_init_required")
        if not known.keyword and (required is not None or any(kw.arg is None for kw in call.keywords)):
            continue  # the engine told whether to make the group (`dist_init_required=False`: made before)
        given = keyword(call, known.keyword) if known.keyword else None
        node = given.value if given is not None else next((
            arg for index, arg in enumerate(call.args) if index in known.positions and not _not_backend(arg)),
            None)
        if node is None:
            if any(kw.arg is None for kw in call.keywords):
                continue  # `**kwargs` may name the backend
            yield BackendInit(source.path, call.lineno, known.default, hedged=known.hedged)
            continue
        found = values.values(node)
        nccl = [v for v in found if v.text is not None and cuda_only(v.text)]
        if nccl:
            how = f"backend `{nccl[0].text}`" + (f" from {nccl[0].how}" if nccl[0].how else "")
            yield BackendInit(source.path, call.lineno, how, hedged=len(nccl) < len(found))


def _not_backend(node: ast.expr) -> bool:
    """A positional argument that cannot be the backend: a literal naming none (a config path, a port), a
    config dict (`dict(...)`, `{...}`, `Config(...)`)."""
    if isinstance(node, ast.Constant):
        return not (isinstance(node.value, str) and all(
            part.rsplit(":", 1)[-1].strip().lower() in _BACKEND_NAMES for part in node.value.split(",")))
    return isinstance(node, ast.Dict) or isinstance(node, ast.Call) and (
        dotted(node.func) or "").rsplit(".", 1)[-1] in ("dict", "Config")


def _literal(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else ...


def _accelerate(call: ast.Call) -> tuple[str, bool] | None:
    """`Accelerator(...)`: NCCL-only on a multi-GPU CUDA host unless `cpu=True` or a handler names a
    backend."""
    if any(kw.arg is None for kw in call.keywords):
        return None  # `**kwargs` may hold `cpu=True` or a backend handler
    cpu = keyword(call, "cpu")
    if cpu is not None and _literal(cpu.value) is not False:
        return None  # `cpu=True`, or a value the checker cannot read
    handlers = keyword(call, "kwargs_handlers")
    if handlers is not None:
        if not isinstance(handlers.value, (ast.List, ast.Tuple)):
            return None  # handlers built elsewhere: the backend is unknown
        for node in ast.walk(handlers.value):
            if isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("InitProcessGroupKwargs"):
                backend = keyword(node, "backend")
                value = _literal(backend.value) if backend is not None else "nccl"
                if not (isinstance(value, str) and cuda_only(value)):
                    return None
    return ("accelerate's default: with several CUDA GPUs `Accelerator()` creates the group with backend "
            "`nccl` (CUDA only; `cpu=True` or a CPU-only host gives gloo)", True)


def _lightning(call: ast.Call) -> tuple[str, bool] | None:
    """`Trainer(strategy="ddp", accelerator="gpu")` / `Fabric(...)`: NCCL on CUDA devices unless the strategy
    is given `process_group_backend=`."""
    accelerator = keyword(call, "accelerator")
    device = _literal(accelerator.value) if accelerator is not None else "auto"
    if device not in ("gpu", "cuda", "auto"):
        return None
    strategy = keyword(call, "strategy")
    if strategy is None:
        return None  # a single device, or Lightning's choice: not reported
    chosen = strategy.value
    if isinstance(chosen, ast.Call):
        name = (dotted(chosen.func) or "").rsplit(".", 1)[-1].lower()
        if not name.startswith(DISTRIBUTED_STRATEGIES):
            return None
        backend = keyword(chosen, "process_group_backend")
        if backend is not None:
            value = _literal(backend.value)
            if not (isinstance(value, str) and cuda_only(value)):
                return None
        label = f"`{(dotted(chosen.func) or name).rsplit('.', 1)[-1]}()`"
    else:
        value = _literal(chosen)
        if not (isinstance(value, str) and value.lower().startswith(DISTRIBUTED_STRATEGIES)) or "cpu" in str(
            value
        ):
            return None
        label = f"`strategy={value!r}`"
    on = (
        "on CUDA devices"
        if device in ("gpu", "cuda")
        else "when it runs on CUDA devices (`accelerator` is auto)"
    )
    return (f"Lightning's default for {label} {on}: backend `nccl`, CUDA only", device == "auto")


def _torch_inits(source: SourceFile) -> Iterator[BackendInit]:
    from .project import BackendInit

    values = BackendValues(source)
    for call in source.calls:
        qual = source.resolve(call.func) or ""
        if not (qual.startswith("torch.distributed") and qual.endswith("init_process_group")):
            continue
        backend = keyword(call, "backend")
        node = backend.value if backend else (call.args[0] if call.args else None)
        if node is None:
            if keyword(call, "device_id") is not None or any(kw.arg is None for kw in call.keywords):
                continue
            yield BackendInit(
                source.path,
                call.lineno,
                "no backend: only the accelerator's backend is created (NCCL on a CUDA host since torch 2.6)",
                hedged=True,
            )
            continue
        found = values.values(node)
        nccl = [v for v in found if v.text is not None and cuda_only(v.text)]
        if not nccl:
            continue
        others = len(nccl) < len(found)
        literal = f"`{nccl[0].text}`"
        how = f"backend {literal}" + (f" from {nccl[0].how}" if nccl[0].how else "")
        if others:
            why = next((v.how for v in found if v.text is None and v.how), "")
            how += f" ({why})" if why else " (in one of its branches)"
        yield BackendInit(source.path, call.lineno, how, hedged=others)


def cpu_group(source: SourceFile, group: ast.expr) -> bool:
    """`group` is bound in this file to `new_group(..., backend=...)` with a backend for CPU tensors
    (`control = dist.new_group(backend="gloo")`): a collective on it takes CPU tensors, whatever backend the
    default group has."""
    text = ast.unparse(group)
    for node in walk(source.tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and (dotted(node.value.func) or "").endswith("new_group")
                and any(ast.unparse(target) == text for target in node.targets)):
            continue
        backend = keyword(node.value, "backend")
        value = _literal(backend.value) if backend is not None else None
        if isinstance(value, str) and not cuda_only(value):
            return True
    return False
