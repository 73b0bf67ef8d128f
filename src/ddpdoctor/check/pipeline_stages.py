"""The stages of a DeepSpeed pipeline and the tensors they hand to the next stage.

A `deepspeed.pipe.PipelineModule(layers=[...])` runs its layers as stages on different ranks; the
`PipelineEngine` sends what a stage's `forward` returns to the next stage, each tensor of a returned tuple
with `p2p.send(buffer, self.next_stage)` (`_exec_send_activations` in deepspeed/runtime/pipe/engine.py):
point-to-point ops on the pipeline's group, which is NCCL on CUDA hosts. So a stage output is an implicit
argument of a collective, though the program never calls one (DDP301 asks this module).

A class is a stage when the file makes it as a layer: an element of a list display (`[Stem(cfg), ...]`),
appended to a list (`layers.append(Block(b))`), or named in a `LayerSpec(Block, ...)` /
`TiedLayerSpec(key, Block, ...)`. What its `forward` returns is read where it is a tuple or list display, or
the positional arguments of a call of a project function that packs them (`return pack(x, flag, target)`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from .source import SourceFile, call_name
from .tensors import cpu_expression

PIPELINE_MODULES = ("deepspeed.pipe.PipelineModule", "deepspeed.PipelineModule",
                    "deepspeed.runtime.pipe.PipelineModule", "deepspeed.runtime.pipe.module.PipelineModule")
_SPECS = {"LayerSpec": 0, "TiedLayerSpec": 1}  # where the layer's class is among their arguments


def builds_pipeline(source: SourceFile) -> bool:
    """The file makes a DeepSpeed `PipelineModule` (resolved through its imports)."""
    return "PipelineModule" in source.text and any(
        (source.resolve(call.func) or "") in PIPELINE_MODULES for call in source.calls)


def stage_classes(source: SourceFile) -> set[str]:
    """Classes of this file that it makes as pipeline layers (module docstring)."""
    classes = {node.name for node in source.tree.body if isinstance(node, ast.ClassDef)}
    found: set[str] = set()
    for node in ast.walk(source.tree):
        made: list[ast.expr] = []
        if isinstance(node, ast.List):
            made = list(node.elts)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "append", "extend") and node.args:
            made = [node.args[0], *(node.args[0].elts if isinstance(node.args[0], ast.List) else [])]
        elif isinstance(node, ast.Call) and call_name(node) in _SPECS:
            index = _SPECS[call_name(node)]
            named = node.args[index] if index < len(node.args) else None
            if isinstance(named, ast.Name):
                found.add(named.id)
            continue
        for item in made:
            if isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id in classes:
                found.add(item.func.id)
    return found & classes


def stage_returns(source: SourceFile, packs: Callable[[ast.Call], bool]
                  ) -> Iterator[tuple[str, ast.FunctionDef, ast.expr]]:
    """(class, its `forward`, an expression it returns to the next stage) for every stage class of the file;
    `packs` says whether a returned call packs its arguments as the output (a project function's)."""
    stages = stage_classes(source)
    for node in source.tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name in stages):
            continue
        forward = next((item for item in node.body
                        if isinstance(item, ast.FunctionDef) and item.name == "forward"), None)
        if forward is None:
            continue
        for ret in _returns(forward):
            value = ret.value
            if isinstance(value, (ast.Tuple, ast.List)):
                parts = list(value.elts)
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and packs(value):
                parts = list(value.args)
            else:
                continue
            for part in parts:
                yield node.name, forward, part.value if isinstance(part, ast.Starred) else part


def _returns(function: ast.FunctionDef) -> Iterator[ast.Return]:
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Return) and node.value is not None:
            yield node
        stack.extend(ast.iter_child_nodes(node))


def cpu_stage_outputs(source: SourceFile, packs: Callable[[ast.Call], bool]
                      ) -> Iterator[tuple[str, ast.expr, str]]:
    """(class, returned expression, how it is made) for the stage outputs that are CPU tensors: made so in
    the return, or a name every binding of which that reaches the return makes one (the value-flow core)."""
    from .values import scope_of_calls  # the core imports the rank domain, loaded on demand

    for cls, _forward, part in stage_returns(source, packs):
        created = cpu_expression(source, part)
        if created is None and isinstance(part, ast.Name):
            bound = scope_of_calls(source)(part).at(part).get(part.id)
            made = [cpu_expression(source, b.value) if b.value is not None else None for b in bound or ()]
            created = min(made) if made and all(made) else None  # type: ignore[type-var]
        if created is not None:
            yield cls, part, created
