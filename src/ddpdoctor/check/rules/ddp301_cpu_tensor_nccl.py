from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator

from ...findings import Finding, Fix, Severity
from ..backends import ENGINE_INIT, cpu_group, nccl_inits
from ..collectives import TENSOR_ARGS
from ..pipeline_stages import builds_pipeline, cpu_stage_outputs
from ..project import BackendInit, Target, show_chain
from ..registry import Rule, register
from ..source import SourceFile, child_nodes, statements
from ..subgroups import GROUP_KEYWORDS
from ..tensors import cpu_expression
from ..values import scope_of_calls


@register
class CpuTensorOnNcclGroup(Rule):
    """
    ## What it does
    Finds `torch.distributed` collectives on CPU tensors — created without a device (`torch.tensor(x)`,
    `torch.zeros(n)`, `torch.FloatTensor([...])`, ...) or on the CPU outright (`device="cpu"`,
    `device=torch.device("cpu")`), or moved there (`.cpu()`, `.to("cpu")`) — when the
    default process group has backends for `cuda` only (`"nccl"`, `"cuda:nccl"`, or `"cuda:gloo"`, the
    CPU stand-in for it).

    The backend is followed through literals, names bound in the file, argparse defaults
    (`init_process_group(backend=args.dist_backend)` with `add_argument("--dist-backend",
    default="nccl")`), dict literals (`cfg["backend"]`), `os.environ.get("BACKEND", "nccl")` and
    conditionals (`"nccl" if cuda else "gloo"`: reported, hedged, for the NCCL branch), and parameters
    (`def init_dist(launcher, backend="nccl")` handing `backend` to the helper that calls
    `init_process_group(backend=backend)`: the default joined with what the file's calls pass, hedged since
    a caller in another file may pass another backend). A call without a
    backend (`init_process_group()`, or with only `init_method`) is reported hedged: since torch 2.6 it
    creates only the backend of the host's accelerator — NCCL on a CUDA host, gloo on a CPU-only one
    (`BackendConfig` in `torch/distributed/distributed_c10d.py`). Frameworks that create the group count
    where the file shows them: `Accelerator()` / `PartialState()` (hedged: accelerate picks `nccl` when it
    runs on several CUDA GPUs, `PartialState.__init__` in accelerate/state.py; not with `cpu=True` or an
    `InitProcessGroupKwargs(backend=...)` naming another backend), and Lightning's
    `Trainer`/`Fabric(strategy="ddp"|"fsdp"|"deepspeed"|DDPStrategy(...), accelerator="gpu"|"cuda")`
    (`nccl` from `default_device_backend_map["cuda"]`, `_get_process_group_backend` in the strategies;
    not with `process_group_backend="gloo"`; hedged with `accelerator="auto"`), DeepSpeed's
    `deepspeed.init_distributed()` (hedged: without `dist_backend` it takes the accelerator's backend,
    `get_accelerator().communication_backend_name()` in deepspeed/comm/comm.py, `"nccl"` for
    `CUDA_Accelerator` in deepspeed/accelerator/cuda_accelerator.py) and Colossal-AI's `colossalai.launch`
    and `launch_from_torch`/`_slurm`/`_openmpi` (`backend: str = "nccl"` in colossalai/initialize.py, handed
    to `init_process_group`), and `deepspeed.initialize(...)` where no file of the program makes the group
    (it then calls `init_distributed` with the accelerator's backend, deepspeed/__init__.py; not with
    `dist_init_required=`); their `dist_backend=`/`backend=` is followed like `init_process_group`'s, and
    a file's own `init_process_group` comes first (the frameworks do not remake a group). When the file does
    not initialise the group itself, an initialisation in another file of the same program (files linked by
    imports) counts.

    A tensor counts when it is made in the collective's argument or bound once, in the same function, to
    such an expression (`total = torch.FloatTensor([s, n]); dist.all_reduce(total)` in a method). It is
    followed into project functions, in any module and at any depth: a CPU tensor passed to a function
    whose parameter reaches a collective unchanged (`reduce_mean(torch.tensor(n))` → `all_reduce(t)`), or
    a dict or list holding one (`stats["n"] = torch.tensor(n)`, `{"n": x.cpu()}`, `.append(...)`) passed
    to a function that reduces its elements (`for k, v in stats.items(): dist.all_reduce(v)`), is reported
    at the argument with the chain. A tensor returned by a project function counts when every `return` of
    that function gives a CPU tensor (`counts = accuracy_counts(...)` with `return torch.tensor([c, n])`).
    A library's implicit sends count too: in a program that builds a DeepSpeed `PipelineModule`, the tuple
    a stage's `forward` returns (a class made as a layer: `[Stem(cfg), ...]`, `LayerSpec(Block, ...)`) is
    sent to the next stage tensor by tensor with `p2p.send` (`_exec_send_activations`,
    deepspeed/runtime/pipe/engine.py): a CPU tensor among those outputs is reported where it is returned.

    Limits: a helper that rebinds its parameter (`t = t.to(device)`) is not followed; tensors returned on
    some paths only, kept on attributes, or built from values whose device is unknown (`x.mean()`,
    `batch["scores"]`), model parameters that may still be on the CPU (`dist.broadcast(p.data)` of a model
    never moved), and accelerate's, Lightning's or DeepSpeed's own collectives (which move tensors for you)
    are not followed or not reported. A file that calls `torch.set_default_device` is skipped.

    ## Why is this bad?
    A process group holds one backend per device type. `init_process_group("nccl")` registers NCCL for
    `cuda` only, so a collective on a CPU tensor has no backend at all and fails with
    `RuntimeError: No backend type associated with device type cpu`. The same code passes on a CPU
    test machine with gloo, and fails on the GPU cluster.

    ## Known problems
    A tensor's device is known where it is made (a factory without `device=`, `.cpu()`), on every path
    that reaches the collective, through parameters and returns; a tensor a library returns, or a model's
    parameter that may still be on the CPU (`dist.broadcast(param.data)` before `.cuda()`), is unknown and
    not reported. The backend comes from `init_process_group`, argparse defaults and the frameworks'
    set-ups; one read from configuration is hedged. A backend handed down as a parameter is read from its
    default and the calls of its own file; what callers in other files pass is not read (a test that calls
    the package's `init_dist(launcher, "gloo")`), so such a finding is hedged. A collective on a group given
    as `group=` that the file binds to `new_group(..., backend="gloo")` (a literal with a CPU backend) is not
    reported; a group made elsewhere is taken to have the default group's backends.

    ## Example
    ```python
    dist.init_process_group("nccl")
    loss_sum = torch.tensor(total)
    dist.all_reduce(loss_sum)
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    loss_sum = torch.tensor(total, device=f"cuda:{local_rank}")
    dist.all_reduce(loss_sum)
    ```
    or register a backend for both device types: `init_process_group(backend="cpu:gloo,cuda:nccl")`.

    ## Fix safety
    No automatic fix: the right device is the rank's device, which the checker cannot name.

    ## References
    - <https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/19912>
    """

    code = "DDP301"
    name = "cpu-tensor-nccl-collective"
    class_slug = "backend-device-mismatch"
    severity = Severity.ERROR
    summary = "a collective on a tensor created without a device where the group is NCCL-only"
    triggers = tuple(TENSOR_ARGS)

    project_wide = True

    @classmethod
    def wanted(cls, text: str) -> bool:
        return "distributed" in text and any(t in text for t in cls.triggers) or "PipelineModule" in text

    @classmethod
    def wanted_in_project(cls, text: str) -> bool:
        return "torch" in text or ".cpu(" in text  # the collective may be in a helper of another file

    def check(self, source: SourceFile) -> Iterator[Finding]:
        if "set_default_device" in source.text and any(
                source.resolve(call.func) == "torch.set_default_device" for call in source.calls):
            return  # the default device may be CUDA: a factory without `device=` is not known to be CPU
        init = self._init(source)
        if init is None:
            return
        project = source.project
        resolver = project.resolver(source) if project is not None else None
        classes = [(node.lineno, node.end_lineno or node.lineno, node.name) for node in source.tree.body
                   if isinstance(node, ast.ClassDef)]
        def returned(call: ast.Call) -> str | None:
            """`t = make_counts()`: a project function that returns a CPU tensor."""
            if resolver is None or project is None:
                return None
            cls = next((name for start, end, name in classes if start <= call.lineno <= end), None)
            found = resolver.callee(call.func, cls)
            chain = project.returns_cpu(found[0]) if found is not None else None
            return f"returned by {show_chain(chain)}" if chain else None

        for scope in _scopes(source.tree):
            cpu_names = _cpu_tensor_names(source, scope, returned)
            containers: dict[str, str] | None = None
            for call in _scope_calls(scope):
                qual = source.resolve(call.func) or ""
                head, _, op = qual.rpartition(".")
                if not head.startswith("torch.distributed") or op not in TENSOR_ARGS:
                    if resolver is None or project is None or not (call.args or call.keywords):
                        continue
                    cls = next((name for start, end, name in classes if start <= call.lineno <= end), None)
                    found = resolver.callee(call.func, cls)
                    if found is None:
                        continue
                    if containers is None:
                        containers = _cpu_containers(source, scope, cpu_names)
                    yield from self._passed(source, call, found, init, cpu_names, containers)
                    continue
                group = next((kw.value for kw in call.keywords if kw.arg in GROUP_KEYWORDS), None)
                if group is not None and cpu_group(source, group):
                    continue  # a group of its own, made with a backend for CPU tensors
                for index in TENSOR_ARGS[op]:
                    arg = call.args[index] if index < len(call.args) else None
                    if arg is None:
                        continue
                    created = cpu_expression(source, arg)
                    if created is None and isinstance(arg, ast.Name):
                        created = cpu_names.get(arg.id) or _cpu_on_every_path(source, arg, call)
                    if created is None:
                        continue
                    where = "" if init.path == source.path else f" in {os.path.basename(init.path)}"
                    source_of = f"line {init.line}{where}: {init.how}"
                    if init.hedged:
                        message = (
                            f"`{source.segment(arg)}` is a CPU tensor ({created}) passed to `{op}`; the "
                            f"group may have a backend for CUDA only ({source_of}), and then it has no "
                            "backend for CPU tensors"
                        )
                    else:
                        message = (
                            f"`{source.segment(arg)}` is a CPU tensor ({created}) passed to `{op}` on a "
                            f"group initialised with backends for CUDA only ({source_of}), which has no "
                            "backend for CPU tensors"
                        )
                    yield self.finding(
                        source,
                        arg,
                        message,
                        fix=Fix(
                            message="create the tensor on the rank's GPU (`device=...`), or initialise with "
                            'backend="cpu:gloo,cuda:nccl"'
                        ),
                        facts={"hedged": init.hedged, "init_line": init.line},
                    )
                    break
        yield from self._stage_outputs(source, init)

    def _stage_outputs(self, source: SourceFile, init: BackendInit) -> Iterator[Finding]:
        """A CPU tensor among a DeepSpeed pipeline stage's outputs, sent to the next stage."""
        project = source.project
        if "forward" not in source.text or not (builds_pipeline(source) or project is not None and (
                source.path in project.modules and any(m.pipeline for m in project.component(source.path)))):
            return
        resolver = project.resolver(source) if project is not None else None
        for cls, part, how in cpu_stage_outputs(source, lambda call: resolver is not None and (
                resolver.callee(call.func, None) is not None)):
            yield self.finding(source, part, f"`{source.segment(part)}` is a CPU tensor ({how}) returned by "
                               f"`{cls}.forward`, a DeepSpeed `PipelineModule` stage: its engine sends each "
                               f"output on (`p2p.send`); {_group_words(source, init)}",
                               facts={"hedged": init.hedged, "init_line": init.line, "via": f"{cls}.forward"},
                               fix=Fix(message="create the tensor on the input's device (`device=x.device`)"))

    def _passed(self, source: SourceFile, call: ast.Call, callee: tuple[Target, bool], init: BackendInit,
                cpu_names: dict[str, str], containers: dict[str, str]) -> Iterator[Finding]:
        """A CPU tensor (or a dict or list holding one) passed to a project function that hands it to a
        collective, at any depth and in any module."""
        project = source.project
        if project is None:
            return
        target, bound = callee
        arguments: list[tuple[int | str, ast.expr]] = [*enumerate(call.args)]
        arguments += [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
        for where, arg in arguments:
            tensor = cpu_expression(source, arg) or (
                cpu_names.get(arg.id) if isinstance(arg, ast.Name) else None
            )
            held = (
                containers.get(arg.id) if isinstance(arg, ast.Name) else _cpu_literal(source, arg, cpu_names)
            )
            if tensor is None and held is None:
                continue
            taken = project.collective_argument(target, where, bound)
            if taken is None:
                continue
            kind, chain = taken
            created = tensor if kind == "" else held
            if created is None:
                continue
            what = "a CPU tensor" if kind == "" else "holds a CPU tensor"
            verb = "is" if kind == "" else ""
            yield self.finding(
                source,
                arg,
                f"`{source.segment(arg)}` {verb + ' ' if verb else ''}{what} ({created}) and reaches "
                f"{show_chain(chain)}; {_group_words(source, init)}",
                fix=Fix(
                    message="create the tensor on the rank's GPU (`device=...`), or initialise with "
                    'backend="cpu:gloo,cuda:nccl"'
                ),
                facts={
                    "hedged": init.hedged,
                    "init_line": init.line,
                    "via": " → ".join(s.show() for s in chain),
                },
            )

    @staticmethod
    def _init(source: SourceFile) -> BackendInit | None:
        """This file's NCCL-only initialisation, else one elsewhere in the program (files linked by
        imports); `deepspeed.initialize` counts where no file of the program makes the group itself."""
        project = source.project
        known = project is not None and source.path in project.modules
        component = project.component(source.path) if project is not None and known else []
        made = any(m.makes_group for m in component)
        kept = [i for i in nccl_inits(source) if not (made and i.how.startswith(ENGINE_INIT))]
        if kept or "init_process_group" in source.text or not known:
            return min(kept, key=lambda i: (i.hedged, i.line), default=None)  # none: a CPU backend here
        elsewhere = [i for m in component for i in m.inits if not (made and i.how.startswith(ENGINE_INIT))]
        if not elsewhere or len(elsewhere) != sum(len(m.inits) for m in component if m.path != source.path):
            return None
        return sorted(elsewhere, key=lambda i: (i.hedged, i.path, i.line))[0]


def _group_words(source: SourceFile, init: BackendInit) -> str:
    where = "" if init.path == source.path else f" in {os.path.basename(init.path)}"
    source_of = f"line {init.line}{where}: {init.how}"
    if init.hedged:
        return (
            f"the group may have a backend for CUDA only ({source_of}), and then it has none for CPU tensors"
        )
    return f"the group has backends for CUDA only ({source_of}), none for CPU tensors"


def _cpu_literal(source: SourceFile, node: ast.expr, cpu_names: dict[str, str]) -> str | None:
    """A dict, list or tuple display with a CPU tensor among its values."""
    if isinstance(node, ast.Dict):
        items: list[ast.expr] = [v for v in node.values if v is not None]
    elif isinstance(node, (ast.List, ast.Tuple)):
        items = list(node.elts)
    else:
        return None
    for item in items:
        found = cpu_expression(source, item) or (
            cpu_names.get(item.id) if isinstance(item, ast.Name) else None
        )
        if found:
            return found
    return None


def _cpu_containers(source: SourceFile, body: list[ast.stmt], cpu_names: dict[str, str]) -> dict[str, str]:
    """Names of one scope that hold a CPU tensor among their values: `stats = {"n": torch.tensor(n)}`,
    `stats["n"] = count.cpu()`, `values.append(torch.tensor(x))`."""
    found: dict[str, str] = {}
    for node in _scope_nodes(body):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and (held := _cpu_literal(source, node.value, cpu_names)):
                    found.setdefault(target.id, held)
                elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and (
                        made := cpu_expression(source, node.value) or (
                        cpu_names.get(node.value.id) if isinstance(node.value, ast.Name) else None)):
                    found.setdefault(target.value.id, made)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and (isinstance(node.func.value, ast.Name) and len(node.args) == 1)
        ):
            made = cpu_expression(source, node.args[0]) or (
                cpu_names.get(node.args[0].id) if isinstance(node.args[0], ast.Name) else None)
            if made:
                found.setdefault(node.func.value.id, made)
    return found


def _scopes(tree: ast.Module) -> Iterator[list[ast.stmt]]:
    yield tree.body
    for node in statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.body


def _scope_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of one scope, not descending into nested functions, classes or lambdas."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(child_nodes(node))


def _scope_calls(body: list[ast.stmt]) -> list[ast.Call]:
    calls = [n for n in _scope_nodes(body) if isinstance(n, ast.Call)]
    calls.sort(key=lambda c: (c.lineno, c.col_offset))
    return calls


def _cpu_on_every_path(source: SourceFile, name: ast.Name, call: ast.Call) -> str | None:
    """A name whose every binding that reaches the collective makes a CPU tensor (both branches of an
    `if`), asked of the value-flow core: how the first one makes it."""
    bound = scope_of_calls(source)(call).at(call).get(name.id)
    if not bound:
        return None
    made = [cpu_expression(source, b.value) if b.value is not None else None for b in bound]
    if all(made):
        return sorted(made, key=lambda how: how or "")[0]  # type: ignore[return-value]
    return None


def _cpu_tensor_names(source: SourceFile, body: list[ast.stmt],
                      returned: Callable[[ast.Call], str | None] | None = None) -> dict[str, str]:
    """Names of one scope bound exactly once there, to a CPU tensor (made there, or returned as one by a
    project function)."""
    bound: dict[str, list[str | None]] = {}
    for stmt in _scope_nodes(body):
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    made = cpu_expression(source, stmt.value)
                    if made is None and returned is not None and isinstance(stmt.value, ast.Call):
                        made = returned(stmt.value)
                    bound.setdefault(target.id, []).append(made)
                else:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            bound.setdefault(sub.id, []).append(None)
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
            for sub in ast.walk(stmt.target):
                if isinstance(sub, ast.Name):
                    bound.setdefault(sub.id, []).append(None)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    for sub in ast.walk(item.optional_vars):
                        if isinstance(sub, ast.Name):
                            bound.setdefault(sub.id, []).append(None)
    return {name: made[0] for name, made in bound.items() if len(made) == 1 and made[0] is not None}
