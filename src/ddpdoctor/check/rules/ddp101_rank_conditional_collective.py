from __future__ import annotations

import ast
from collections.abc import Iterator

from ...findings import Applicability, Edit, Finding, Fix, Severity
from ..collectives import TRIGGERS, CollectiveCalls
from ..guards import RANK_ZERO_DECORATORS, Function, GuardedCall, RankFlow, branch_calls
from ..registry import Rule, register
from ..source import SourceFile, keyword


@register
class RankConditionalCollective(Rule):
    """
    ## What it does
    Finds collectives that only some ranks reach: a `torch.distributed` collective (`all_reduce`,
    `barrier`, `broadcast`, `new_group`, ...), Lightning's `self.log(..., sync_dist=True)`,
    `self.all_gather`, `trainer.strategy.barrier/broadcast/reduce`, Fabric's and accelerate's collectives
    (`fabric.barrier`, `accelerator.gather`, `wait_for_everyone`, ...) and torchmetrics' `compute()`,
    called under a rank condition.

    A rank condition is a test of `rank`, `global_rank`, `local_rank`, `dist.get_rank()`,
    `int(os.environ["RANK"])`, `trainer.is_global_zero`, `self.global_rank`,
    `accelerator.is_main_process`, `fabric.is_global_zero`, ... — also through local variables
    (`main = rank == 0`), `and`/`or`/`not`, an early `return`/`continue` under such a test, and in functions
    decorated with `@rank_zero_only`. A call to a function of the same file that issues a collective counts
    too: the finding is at the guarded call and names the collective inside.

    Not findings: an `if` whose two branches make the same collectives in the same order, a rank test that
    only chooses a value (`src = 0 if rank == 0 else None`), `self.log(..., rank_zero_only=True)`, and
    point-to-point calls (`send`/`recv`), where a rank test is how the code says who sends.

    ## Why is this bad?
    Every rank of a process group must make the same collectives in the same order. A collective that only
    rank 0 reaches waits for peers that never come: the job hangs without a message until the backend's
    timeout (30 minutes for gloo, 10 for NCCL), then dies with a watchdog or `Connection reset by peer`
    error that points nowhere near this line. Lightning's `self.log(..., sync_dist=True)` is such a
    collective: logging under `if self.trainer.is_global_zero:` hangs the job.

    ## Example
    ```python
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            score = expensive_metric(self.outputs)
            self.log("val_score", score, sync_dist=True)  # rank 0 waits for the others forever
    ```

    ## Use instead
    ```python
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            score = expensive_metric(self.outputs)
            self.log("val_score", score, rank_zero_only=True)  # no sync: only rank 0 logs
    ```
    or compute the value on every rank and log it with `sync_dist=True` outside the rank test. For
    `torch.distributed` calls, call the collective on every rank and guard only the side effect (printing,
    saving).

    ## Fix safety
    `self.log(..., sync_dist=True)` under a rank guard becomes `self.log(..., rank_zero_only=True)`. The fix
    is safe: in that branch a sync can only hang, and `rank_zero_only=True` is Lightning's documented way to
    log from one rank. A metric logged that way cannot be monitored by callbacks on the other ranks (early
    stopping, checkpointing), which is already the case for a value only rank 0 computes. Other
    collectives have no automatic fix: where the call belongs depends on the program.

    ## References
    - <https://lightning.ai/docs/pytorch/stable/visualize/logging_advanced.html#rank-zero-only>
    - <https://pytorch.org/docs/stable/distributed.html#collective-functions>
    - <https://github.com/Lightning-AI/pytorch-lightning/issues/18695>
    """

    code = "DDP101"
    name = "rank-conditional-collective"
    class_slug = "collective-divergence"
    severity = Severity.ERROR
    summary = "a collective reachable only under a rank condition"
    triggers = TRIGGERS

    def check(self, source: SourceFile) -> Iterator[Finding]:
        labels = CollectiveCalls(source)
        module_functions, methods = _function_tables(source)
        helpers = _collective_helpers(labels, module_functions, methods)

        def signature(stmts: list[ast.stmt]) -> tuple[str, ...]:
            tokens = []
            for call in branch_calls(stmts):
                label = labels.label(call)
                if label is None and _helper_key(call) in helpers:
                    label = _helper_key(call)
                if label is not None:
                    tokens.append(label)
            return tuple(tokens)

        flow = RankFlow(source, signature)
        for guarded in flow.calls:
            if guarded.guard is None:
                continue
            label = labels.label(guarded.call)
            if label is not None:
                yield self._direct(source, guarded, label)
                continue
            target = _resolve(guarded, module_functions, methods)
            if target is not None and target in helpers:
                inner_label, inner_call = helpers[target]
                yield self.finding(
                    source, guarded.call,
                    f"`{_callee(source, guarded.call)}()` issues the collective `{inner_label}` (line "
                    f"{inner_call.lineno}) but only some ranks call it (`{guarded.guard.description}`, line "
                    f"{guarded.guard.line}); the other ranks never join it, so the job hangs",
                    facts={"collective": inner_label, "guard_line": guarded.guard.line, "via": target.name},
                )

    def _direct(self, source: SourceFile, guarded: GuardedCall, label: str) -> Finding:
        assert guarded.guard is not None
        fix = None
        if label.endswith("(sync_dist=True)"):
            sync = keyword(guarded.call, "sync_dist")
            assert sync is not None
            line, column, end_line, end_column = source.span(sync)
            fix = Fix(
                message="log with `rank_zero_only=True` instead of `sync_dist=True` (no sync in a one-rank branch)",
                edits=(Edit(source.path, line, column, end_line, end_column, "rank_zero_only=True"),),
                applicability=Applicability.SAFE,
            )
            shown = label.replace("(sync_dist=True)", "(..., sync_dist=True)")
            what = f"`{shown}` syncs the value across ranks"
        else:
            fix = Fix(message="call the collective on every rank and guard only the side effect")
            what = f"`{label}` is a collective"
        return self.finding(
            source, guarded.call,
            f"{what}, but only some ranks reach it (`{guarded.guard.description}`, line {guarded.guard.line}); "
            "the other ranks never call it, so the job hangs",
            fix=fix, facts={"collective": label, "guard_line": guarded.guard.line},
        )


FunctionKey = Function


def _function_tables(source: SourceFile) -> tuple[dict[str, Function], dict[tuple[str, str], Function]]:
    module_functions: dict[str, Function] = {}
    methods: dict[tuple[str, str], Function] = {}
    for node in source.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module_functions[node.name] = node
    for cls in source.classes.values():
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods[(cls.name, node.name)] = node
    for name in source.imports.names:  # an imported name shadows nothing here, but a def may be rebound
        module_functions.pop(name, None)
    return module_functions, methods


def _helper_key(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return f"self.{func.attr}"
    return None


def _is_rank_zero_only(func: Function) -> bool:
    for deco in func.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        last = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if last in RANK_ZERO_DECORATORS:
            return True
    return False


def _collective_helpers(
    labels: CollectiveCalls,
    module_functions: dict[str, Function],
    methods: dict[tuple[str, str], Function],
) -> dict:
    """Functions of this file that issue a collective, directly or through other such functions.

    Keyed twice: by the function node (for resolved calls) and by `name` / `self.name` (for comparing
    branches). Functions that only run on rank zero are left out: their collectives are reported inside.
    """
    owner: dict[Function, str | None] = {}
    for func in module_functions.values():
        owner[func] = None
    for (cls_name, _name), func in methods.items():
        owner[func] = cls_name
    found: dict = {}
    direct: dict[Function, list[ast.Call]] = {}
    for func in owner:
        if not _is_rank_zero_only(func):
            direct[func] = list(branch_calls(func.body))
    changed = True
    while changed:
        changed = False
        for func, calls in direct.items():
            if func in found:
                continue
            for call in calls:
                label = labels.label(call)
                if label is not None:
                    found[func] = (label, call)
                    break
                target = _lookup(call, owner[func], module_functions, methods)
                if target is not None and target in found and target is not func:
                    found[func] = found[target]
                    break
            if func in found:
                changed = True
                found[f"self.{func.name}" if owner[func] else func.name] = found[func]
    return found


def _lookup(call: ast.Call, cls_name: str | None, module_functions: dict[str, Function],
            methods: dict[tuple[str, str], Function]) -> Function | None:
    key = _helper_key(call)
    if key is None:
        return None
    if key.startswith("self."):
        return methods.get((cls_name, key[5:])) if cls_name else None
    return module_functions.get(key)


def _resolve(guarded: GuardedCall, module_functions: dict[str, Function],
             methods: dict[tuple[str, str], Function]) -> Function | None:
    return _lookup(guarded.call, guarded.cls.name if guarded.cls else None, module_functions, methods)


def _callee(source: SourceFile, call: ast.Call) -> str:
    return source.segment(call.func)
