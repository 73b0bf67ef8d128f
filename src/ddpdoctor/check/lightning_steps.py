"""The collective a LightningModule's `training_step` ends in without calling it (DDP101): with automatic
optimisation, Lightning runs the backward of the loss the step returns, and under a DDP or FSDP strategy that
backward reduces the gradients with every rank. A `return None` (or a bare `return`) skips the step on that
process only: "None - In automatic optimization, this will skip to the next batch (but is not supported for
multi-GPU, TPU, or DeepSpeed)" (Lightning 2.6.6, `LightningModule.training_step`). Under a rank test, or a
test of per-rank data (data_exits.py: the finiteness of this rank's loss), some ranks skip their backward
while the others wait for them in the gradient all-reduce.

Read: classes of the file deriving from `LightningModule` (through classes of the same file) that do not
turn automatic optimisation off (`self.automatic_optimization = False`), whose `training_step` returns a
value on some path and `None` on another, under a test that is a rank test or reads per-rank data. The
strategy is not read (it is often in a config file): the finding says "under a DDP or FSDP strategy".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .collectives import CollectiveCalls
from .data_exits import DataTests, agreeing
from .ranks import RankNames
from .source import SourceFile, child_nodes

STEP = "training_step"
SKIP_FIX = ("decide on every rank together: reduce the skip flag across the ranks first "
            "(`self.trainer.strategy.reduce_boolean_decision(flag, all=False)`), and return a zero loss "
            "(`loss * 0.0`) instead of None, so that every rank runs its backward")


@dataclass(frozen=True)
class SkippedStep:
    """A `return None` in `training_step` under a test some ranks may pass and others not."""

    exit: ast.Return
    test: ast.expr
    data: str  # the per-rank value the test reads; empty for a rank test

    def message(self, source: SourceFile) -> str:
        test = source.segment(self.test).split("\n", 1)[0]
        why = (f"`if {test}` (line {self.test.lineno}) reads {self.data}; where it differs between ranks, "
               if self.data else f"`if {test}` (line {self.test.lineno}) is a rank test: ")
        return (f"`training_step` returns None here, which makes Lightning skip this rank's backward: {why}"
                "under a DDP or FSDP strategy the other ranks' backward waits for this one in the gradient "
                "all-reduce and the job hangs (Lightning: returning None \"is not supported for multi-GPU\")")


def skipped_steps(source: SourceFile) -> Iterator[SkippedStep]:
    if STEP not in source.text or not source.lightning_modules:
        return
    labels = CollectiveCalls(source)
    data = DataTests(source, lambda call: agreeing(call, labels))
    module_names = RankNames(source.tree.body)
    for name in sorted(source.lightning_modules):
        cls = source.classes[name]
        if "automatic_optimization" in source.text_of(cls):  # manual optimisation: None means nothing
            continue
        for step in cls.body:
            if isinstance(step, (ast.FunctionDef, ast.AsyncFunctionDef)) and step.name == STEP:
                yield from _skips(step, RankNames(step.body, module_names), data)


def _skips(step: ast.FunctionDef | ast.AsyncFunctionDef, names: RankNames,
           data: DataTests) -> Iterator[SkippedStep]:
    parents: dict[int, ast.AST] = {}
    returns: list[ast.Return] = []
    stack: list[ast.AST] = [step]
    while stack:
        node = stack.pop()
        for child in child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            parents[id(child)] = node
            if isinstance(child, ast.Return):
                returns.append(child)
            stack.append(child)
    if not any(not _none(r) for r in returns):
        return  # no loss returned on any path: nothing for Lightning to run a backward of
    for exit in sorted((r for r in returns if _none(r)), key=lambda r: r.lineno):
        inner: ast.AST = exit  # walking up to the nearest test some ranks may pass and others not
        while id(inner) in parents:
            parent = parents[id(inner)]
            if isinstance(parent, ast.If):
                side = parent.body if any(s is inner for s in parent.body) else parent.orelse
                test = names.test(parent.test)
                ranks = test.then if side is parent.body else test.orelse
                if ranks.restricted:
                    yield SkippedStep(exit, parent.test, "")
                    break
                found = data.describe(parent.test, step)
                if found:
                    yield SkippedStep(exit, parent.test, found)
                    break
            inner = parent


def _none(ret: ast.Return) -> bool:
    return ret.value is None or isinstance(ret.value, ast.Constant) and ret.value.value is None
