from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ...findings import Applicability, Edit, Finding, Fix, Severity
from ..registry import Rule, register
from ..source import SourceFile
from ..wrapped import ddp_wrapped_classes

_INDEXED_CUDA = re.compile(r"cuda:\d+")


@register
class HardcodedDevice(Rule):
    """
    ## What it does
    Finds hard-coded devices in the methods of a LightningModule, or of a module class that this file wraps
    in `DistributedDataParallel`: `.cuda()`, `"cuda:0"` (any explicit index) and `torch.device("cuda", 0)`;
    and in the constructor of a project class (any file) whose object such a class builds in one of its
    methods, or that such a constructor builds in turn (`self.encoder = Encoder(name)` in a LightningModule,
    `Encoder.__init__` calling `.cuda()`): it runs on every rank too.

    ## Why is this bad?
    Under DDP each rank owns one device, `cuda:<local_rank>`; the strategy moves the model there and sets
    the current device. A hard-coded `"cuda:0"` puts every rank's tensors on GPU 0, so rank 1 fails with
    `Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!`
    (or silently crowds GPU 0). `.cuda()` follows the current device, which is right only if something set
    it, and breaks the module on CPU, MPS and TPU runs.

    ## Known problems
    Only the module classes of the file are read (a LightningModule, or a class this file wraps in
    `DistributedDataParallel`); a class wrapped in another file is not. Of the project classes such a class
    builds, only the constructor is read (their other methods may run on any device the caller chose), and
    only a class derived from a LightningModule in its own file counts as one.

    ## Example
    ```python
    class Model(LightningModule):
        def training_step(self, batch, batch_idx):
            noise = torch.randn(batch.shape).cuda()
            mask = self.mask.to("cuda:0")
    ```

    ## Use instead
    ```python
    class Model(LightningModule):
        def training_step(self, batch, batch_idx):
            noise = torch.randn(batch.shape).to(self.device)  # or torch.randn(..., device=self.device)
            mask = self.mask.to(self.device)  # or register it as a buffer
    ```

    ## Fix safety
    In a LightningModule, `x.cuda()` becomes `x.to(self.device)`. The fix is unsafe: it changes behaviour
    where the code relied on `.cuda()` while the module was still on the CPU (in `__init__`, before the
    strategy moved it), and `self.device` is a LightningModule property, so the fix is offered only there.

    ## References
    - <https://lightning.ai/docs/pytorch/stable/accelerators/accelerator_prepare.html>
    - <https://pytorch.org/tutorials/intermediate/ddp_tutorial.html>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/20276>
    """

    code = "DDP402"
    name = "hardcoded-device"
    class_slug = "foreign-device-hooks"
    severity = Severity.WARNING
    summary = (
        'hard-coded devices (`.cuda()`, `"cuda:0"`, `torch.device("cuda", 0)`) '
        "in a LightningModule / DDP model"
    )
    triggers = ("cuda",)
    project_wide = True  # the constructors of project classes a LightningModule of another file builds

    def check(self, source: SourceFile) -> Iterator[Finding]:
        lightning = source.lightning_modules
        targets = lightning | ddp_wrapped_classes(source)
        for name in sorted(targets, key=lambda n: source.classes[n].lineno):
            cls = source.classes[name]
            if "cuda" not in source.text_of(cls):
                continue
            kind = "LightningModule" if name in lightning else "DDP-wrapped module"
            for method in cls.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield from self._method(source, method, kind, name in lightning)
        if source.project is None or "cuda" not in source.text:
            return
        # A project class whose object a LightningModule (or a DDP-wrapped class) builds, in any file: its
        # constructor runs on every rank, and a device it writes is every rank's.
        for constructor, (owner, start) in sorted(source.project.built_by_managed(source.path).items()):
            cls_name = constructor.split(".", 1)[0]
            built = source.classes.get(cls_name)
            if built is None or cls_name in targets:
                continue
            for method in built.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name == "__init__":
                    kind = f"constructor that `{owner}` runs ({start.show()})"
                    yield from self._method(source, method, kind, False)

    def _method(self, source: SourceFile, method: ast.FunctionDef | ast.AsyncFunctionDef, kind: str,
                lightning: bool) -> Iterator[Finding]:
        for node in ast.walk(method):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "cuda"
                and not _is_module_ref(source, func.value)
            ):
                yield self._cuda_call(source, node, func, kind, lightning and method.name != "__init__")
            elif source.resolve(func) == "torch.device" and len(node.args) == 2 and _is_cuda(node.args[0]):
                index = node.args[1]
                if isinstance(index, ast.Constant) and isinstance(index.value, int):
                    yield self.finding(
                        source, node,
                        f"`{source.segment(node)}` in a {kind} pins every rank to one GPU",
                        fix=Fix(message="use `self.device` (LightningModule) or the rank's device"),
                    )
                continue
            # A "cuda:N" handed to a call (`.to("cuda:0")`, `device="cuda:1"`, `torch.device("cuda:0")`);
            # the same text in a comparison or a message is not a placement.
            for arg in [*node.args, *(kw.value for kw in node.keywords)]:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and _INDEXED_CUDA.fullmatch(arg.value)
                ):
                    yield self.finding(
                        source,
                        arg,
                        f"`{arg.value!r}` in a {kind} pins every rank to one GPU; under DDP each rank has "
                        "its own",
                        fix=Fix(message="use `self.device` (LightningModule) or the rank's device"),
                    )

    def _cuda_call(self, source: SourceFile, call: ast.Call, func: ast.Attribute, kind: str,
                   fixable: bool) -> Finding:
        fix = Fix(message="use `.to(self.device)` (LightningModule) or the rank's device")
        if fixable and not call.args and not call.keywords:
            _, _, value_end_line, value_end_col = source.span(func.value)
            _, _, end_line, end_col = source.span(call)
            fix = Fix(
                message="replace `.cuda()` with `.to(self.device)`",
                edits=(
                    Edit(source.path, value_end_line, value_end_col, end_line, end_col, ".to(self.device)"),
                ),
                applicability=Applicability.UNSAFE,
            )
        return self.finding(
            source, call,
            f"`.cuda()` in a {kind} hard-codes the device; under DDP the strategy decides each rank's device",
            fix=fix,
        )


def _is_cuda(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == "cuda"


def _is_module_ref(source: SourceFile, node: ast.expr) -> bool:
    """`torch.cuda` and friends: `x.cuda` there is a module attribute, not Tensor.cuda()."""
    qual = source.resolve(node)
    return qual is not None and "." not in qual or qual == "torch"
