from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ...findings import Finding, Fix, Severity
from ..devices import accelerator_generator, default_device_call, device_context
from ..registry import Rule, register
from ..source import SourceFile, call_name, keyword, statements

LOADER_SUFFIXES = ("DataLoader", "Sampler")
_DEVICE_CONTEXT = re.compile(r"with\s+(?:torch\.)?device\(")


@register
class LoaderDeviceGenerator(Rule):
    """
    ## What it does
    Finds data loaders and samplers that will draw random numbers on an accelerator: a
    `DataLoader`/`*Sampler` given `generator=torch.Generator(device="cuda")`, and loaders or samplers built
    after `torch.set_default_device("cuda")` or inside `with torch.device("cuda"):`. A generator held by a
    name counts where every binding of that name reaching the loader is such a generator (the same name
    bound to a CPU generator in another function is that function's own).

    ## Why is this bad?
    `RandomSampler` and `DistributedSampler` call `torch.randperm(n, generator=...)` on the CPU. A CUDA
    generator, or a CUDA default device when the sampler creates its own generator, fails with
    `RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'` at the first epoch, in
    Lightning's sanity check or later.

    ## Known problems
    The default device is followed in the file that sets it; a `set_default_device` in another
    module of the program, or one chosen from configuration, is not. A generator passed in as a
    parameter or kept on an attribute is unknown, never evidence.

    ## Example
    ```python
    torch.set_default_device("cuda")
    loader = DataLoader(dataset, shuffle=True)
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, shuffle=True)  # built while the default device is the CPU
    torch.set_default_device("cuda")
    ```
    and give loaders a CPU generator: `generator=torch.Generator().manual_seed(0)`.

    ## Fix safety
    No automatic fix: where the default device should change is the program's decision.

    ## References
    - <https://pytorch.org/docs/stable/generated/torch.set_default_device.html>
    - <https://pytorch.org/docs/stable/data.html#torch.utils.data.RandomSampler>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/19373>
    """

    code = "DDP202"
    name = "loader-device-generator"
    class_slug = "init-module-scope"
    severity = Severity.ERROR
    summary = "a DataLoader/sampler given a non-CPU generator, or built after a global default-device change"
    triggers = ("generator=", "set_default_device", "torch.device(")

    def check(self, source: SourceFile) -> Iterator[Finding]:
        if "generator=" in source.text and "Generator(" in source.text:
            yield from self._generators(source)
        if "set_default_device" in source.text or _DEVICE_CONTEXT.search(source.text):
            yield from self._after_default_device(source)

    def _generators(self, source: SourceFile) -> Iterator[Finding]:
        for node in source.calls:
            if call_name(node).endswith(LOADER_SUFFIXES):
                gen = keyword(node, "generator")
                if gen is None:
                    continue
                where = accelerator_generator(source, gen.value)
                if where is not None:
                    yield self.finding(
                        source,
                        gen,
                        f"`{call_name(node)}` gets a generator on an accelerator (line {where}); samplers "
                        "draw their permutation on the CPU and need a CPU generator",
                        fix=Fix(message="use a CPU generator: `torch.Generator()` (no device)"),
                    )

    def _after_default_device(self, source: SourceFile) -> Iterator[Finding]:
        for block in _blocks(source.tree):
            changed_at: int | None = None
            for stmt in block:
                setting = default_device_call(source, stmt)
                if setting is not None:
                    changed_at = stmt.lineno if setting else None
                    continue
                context = device_context(source, stmt)
                line = changed_at if context is None else stmt.lineno
                if line is None:
                    continue
                body = stmt.body if context is not None else [stmt]  # type: ignore[attr-defined]
                for call in _loader_calls(body):
                    how = ("inside `with torch.device(...)`" if context is not None
                           else "after `torch.set_default_device(...)`")
                    yield self.finding(
                        source, call,
                        f"`{call_name(call)}` is built {how} (line {line}): its sampler's generator would be "
                        "created on that device, and sampling fails",
                        fix=Fix(message="build data loaders before changing the default device, or outside "
                                        "the device context"),
                    )


def _blocks(tree: ast.Module) -> Iterator[list[ast.stmt]]:
    yield tree.body
    for stmt in statements(tree.body):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(stmt, name, None)
            if block and isinstance(block, list):
                yield block


def _loader_calls(stmts: list[ast.stmt]) -> Iterator[ast.Call]:
    """Loaders and samplers that draw random numbers (a sequential loader is harmless on any device)."""
    for stmt in stmts:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and _draws_random(node):
                yield node


def _draws_random(call: ast.Call) -> bool:
    name = call_name(call)
    shuffle = keyword(call, "shuffle")
    if name == "RandomSampler":
        return True
    if name == "DistributedSampler":
        return not (shuffle and isinstance(shuffle.value, ast.Constant) and shuffle.value.value is False)
    if name.endswith("DataLoader"):
        return bool(shuffle and isinstance(shuffle.value, ast.Constant) and shuffle.value.value is True)
    return False
