"""Tests over per-rank data (DDP101, hedged): a value each process computes from its own shard or its own
clock, which may differ between the ranks even though no rank is named.

An early exit under such a test (`if not torch.isfinite(loss): continue`, `if time.time() > deadline:
break`, `if not buffer.full(): continue`, `if batch is None: continue`) lets the ranks where it holds leave
while the others go on to the collectives after it: the job hangs the first time the ranks disagree. What
is read, by its spelling:

- finiteness: `torch.isnan/isinf/isfinite(x)`, `math.` and `numpy.` ones, `x.isnan()` (`.any()`/`.all()`
  after it): the loss of this rank's batch. Not a gradient or its norm (a name holding `grad`, or bound from
  an expression that does: `norm = clip_grad_norm_(...)`): after DDP's or FSDP's gradient reduction those
  agree across the ranks;
- the clock: `time.time()`, `perf_counter()`, `monotonic()` (and names the function binds from them): each
  process reads its own;
- a fill level: `.full()`, `.is_full()`, `.empty()`, `.is_empty()` with no argument, or `len(x)`, of a
  buffer the function fills with `.append`/`.extend` in a loop over a loader: each rank fills its own (a
  bucket of gradients or parameters, filled from the model, is the same everywhere);
- the file system: `os.path.exists/isfile/isdir(p)`, `p.exists()`, `PathManager.exists(p)` of a file the
  file writes under a rank test (file_checks.py): each rank asks its own disk or its cache of a shared one
  (a collective inside such a branch is reported too, unless a branch tests the rank itself);
- an empty batch: `x is None`, `not x`, `len(x) == 0`, `x.numel() == 0`, where `x` is the item of a loop
  over a loader (an iterable whose name ends in `loader` or `data_iter`: `train_loader`,
  `self.val_dataloader`, `enumerate(loader)`).

A value a collective agreed on first is the same everywhere: a name passed to a collective in the
function, bound from one, or computed from such a name, is not per-rank data (`dist.all_reduce(flag)`
then `if flag.item(): break`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from functools import cached_property

from .collectives import CollectiveCalls
from .file_checks import one_rank_file
from .rank_sources import Function
from .source import SourceFile, child_nodes, dotted, last_name, walk

FINITENESS = frozenset({"isnan", "isinf", "isfinite", "isneginf", "isposinf"})
CLOCKS = frozenset({"time", "perf_counter", "monotonic", "time_ns", "perf_counter_ns", "monotonic_ns"})
FILL_METHODS = frozenset({"full", "is_full", "empty", "is_empty"})
LOADER_WORDS = ("loader", "data_iter", "dataiter")  # how the last name of a loader ends
DATA_FIX = ("make every rank take the same decision: reduce the flag across the ranks first (`all_reduce` "
            "with MAX, so that all leave when one would) and leave together, or keep every rank in the step "
            "(a zero loss instead of a skipped one)")
# Calls whose arguments and results are agreed across the ranks: the rule's collectives, and any call named
# like one (a project's `strategy.all_reduce`): generous, so that an agreed value is never taken as per-rank.
AGREEING_WORDS = ("all_reduce", "allreduce", "all_gather", "allgather", "broadcast", "reduce", "gather")
# Words a function must hold for one of its tests to be read (a cheap filter: the walk is not free).
WORDS = ("isnan", "isinf", "isfinite", "time(", "perf_counter(", "monotonic(", "full(", "empty(", "exists(",
         "isfile(", "isdir(", "is_file(", "is_dir(")
FILE_TESTS = frozenset({"exists", "isfile", "isdir", "lexists", "is_file", "is_dir"})
FILE_OWNERS = ("path", "fs", "file", "pathmgr", "pathmanager")  # `PathManager.exists(p)`, `self.fs.isdir(p)`


def may_read(text: str) -> bool:
    """A function's text may hold a test of per-rank data: a word above, a loop over a loader, or a list it
    fills and measures."""
    return any(word in text for word in WORDS) or any(word in text.lower() for word in LOADER_WORDS) or (
        "len(" in text and (".append(" in text or ".extend(" in text))


def agreeing(call: ast.Call, labels: CollectiveCalls) -> bool:
    name = last_name(call.func)
    return labels.label(call) is not None or any(word in name for word in AGREEING_WORDS)


def _names(node: ast.AST) -> set[str]:
    """The whole names an expression reads: `self.stats.mean` once, not `self` besides (a binding of
    `self.t0` says nothing of `self`)."""
    found: set[str] = set()
    stack: list[ast.AST] = [node]
    while stack:
        sub = stack.pop()
        name = dotted(sub) if isinstance(sub, (ast.Name, ast.Attribute)) else None
        if name:
            found.add(name)
        else:
            stack.extend(child_nodes(sub))
    return found


def _reads(names: set[str], among: set[str]) -> bool:
    """One of `names` is one of `among` or a part of one (`flag.item` of `flag`, `self.buf.data` of
    `self.buf`)."""
    return any(name == other or name.startswith(other + ".") for name in names for other in among)


class DataTests:
    """`describe(test, function)`: what per-rank value `test` reads, in words, or None.

    `collective(call)` says whether a call is a collective (the rule's table); it marks what is agreed."""

    def __init__(self, source: SourceFile, collective: Callable[[ast.Call], bool]):
        self.source = source
        self.collective = collective
        self._functions: dict[int, _FunctionValues] = {}

    def describe(self, test: ast.expr, function: Function | None, files_only: bool = False) -> str | None:
        """`files_only`: the file system's state alone (a collective inside such a branch is hedged too)."""
        if function is None:
            return None
        values = self._functions.get(id(function))
        if values is None:
            values = self._functions[id(function)] = _FunctionValues(self.source, function, self.collective)
        return values.describe(test, files_only)


class _FunctionValues:
    def __init__(self, source: SourceFile, function: Function, collective: Callable[[ast.Call], bool]):
        self.source = source
        self.function = function
        self.collective = collective

    @cached_property
    def _assigns(self) -> list[tuple[set[str], ast.expr]]:
        found: list[tuple[set[str], ast.expr]] = []
        for node in walk(self.function):
            if isinstance(node, ast.Assign):
                found.append(({n for t in node.targets for n in _names(t)}, node.value))
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                found.append((_names(node.target), node.value))
        return found

    def _closure(self, seeds: set[str], start: Callable[[ast.expr], bool], before: int = 0) -> set[str]:
        """`seeds`, and each name bound from an expression that `start` accepts or that reads one of them
        (`before`: only bindings above that line)."""
        names = set(seeds)
        for _ in range(4):  # a few rounds: chains of copies are short
            grown = False
            for targets, value in self._assigns:
                if before and value.lineno >= before:
                    continue
                if targets <= names:
                    continue
                if start(value) or _reads(_names(value), names):
                    names |= targets
                    grown = True
            if not grown:
                break
        return names

    @cached_property
    def _collectives(self) -> list[ast.Call]:
        return [node for node in walk(self.function) if isinstance(node, ast.Call) and self.collective(node)]

    def agreed(self, line: int) -> set[str]:
        """Names a collective agreed on above `line`: passed to one, or bound from one (and what is computed
        from them). A collective below the test agrees on nothing the test read."""
        seeds: set[str] = set()
        for call in self._collectives:
            if call.lineno < line:
                for arg in (*call.args, *(kw.value for kw in call.keywords)):
                    seeds |= _names(arg)
        return self._closure(seeds, lambda value: any(
            isinstance(n, ast.Call) and self.collective(n) for n in walk(value)), before=line)

    @cached_property
    def clocks(self) -> set[str]:
        return self._closure(set(), lambda value: any(self._clock(n) for n in walk(value)))

    @cached_property
    def gradients(self) -> set[str]:
        """Names bound from a gradient or its norm (`norm = clip_grad_norm_(...)`): agreed once reduced."""
        return self._closure(set(), lambda value: "grad" in ast.unparse(value).lower())

    @cached_property
    def filled(self) -> set[str]:
        """Lists the function fills in a loop over a loader (`buffer.extend(make(batch))` inside `for batch in
        loader`): each rank with its own shard. A list filled from the model's structure is the same on every
        rank."""
        found: set[str] = set()
        for loop in self._loader_loops:
            for node in walk(loop):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                        node.func.attr in ("append", "extend")):
                    name = dotted(node.func.value)
                    if name:
                        found.add(name)
        return found

    @cached_property
    def _loader_loops(self) -> list[ast.For | ast.AsyncFor]:
        """Loops over a loader: `for batch in loader`, `for i, (x, y) in enumerate(val_loader)`."""
        return [loop for loop in walk(self.function) if isinstance(loop, (ast.For, ast.AsyncFor)) and any(
            name.rsplit(".", 1)[-1].lower().endswith(LOADER_WORDS) for name in _names(loop.iter))]

    @cached_property
    def batches(self) -> set[str]:
        """The items of loops over a loader."""
        return {n.id for loop in self._loader_loops for n in walk(loop.target) if isinstance(n, ast.Name)}

    def _clock(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        qual = self.source.resolve(node.func) or ""
        return qual.startswith("time.") and qual.rsplit(".", 1)[-1] in CLOCKS

    def describe(self, test: ast.expr, files_only: bool = False) -> str | None:
        for node in walk(test):
            found = self._file_state(node) if files_only else self._finiteness(node) or self._clock_read(
                node) or self._fill(node) or self._empty(node) or self._file_state(node)
            if found:  # (what a collective agreed on is asked only then: most tests read no per-rank data)
                return None if _reads(_names(test), self.agreed(test.lineno)) else found
        return None

    def _finiteness(self, node: ast.AST) -> str | None:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in FINITENESS):
            return None
        qual = self.source.resolve(node.func) or ""
        library = qual.split(".", 1)[0] in ("torch", "math", "numpy", "np")
        subject = node.args[0] if library and node.args else None if library else node.func.value
        if subject is None or "grad" in ast.unparse(subject).lower() or _reads(
                _names(subject), self.gradients):
            return None  # a gradient (norm) is reduced across the ranks before anyone reads it
        return (f"whether `{ast.unparse(subject)}` is finite, a value this rank computes from its own batch "
                "(a NaN on one rank is not a NaN on the others)")

    def _file_state(self, node: ast.AST) -> str | None:
        """`os.path.exists(p)`, `p.exists()`, `PathManager.isfile(p)` of a file the source writes on some
        ranks only (file_checks.py): each rank asks its own view of the file system (a node-local disk, or a
        shared one whose attribute cache lags after another rank wrote)."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in FILE_TESTS and not node.keywords):
            return None
        owner = dotted(node.func.value) or ""
        if self.source.resolve(node.func) in {f"os.path.{name}" for name in FILE_TESTS} and node.args:
            subject = node.args[0]
        elif not node.args and node.func.attr in ("exists", "is_file", "is_dir"):
            subject = node.func.value  # a `pathlib.Path`
        elif len(node.args) == 1 and any(word in owner.rsplit(".", 1)[-1].lower() for word in FILE_OWNERS):
            subject = node.args[0]
        else:
            return None
        if not one_rank_file(self.source, subject, self.function):
            return None  # a path handed in, or one every rank writes: taken to look the same everywhere
        return (f"whether `{ast.unparse(subject)}` exists on this rank's file system, a file written on "
                "some ranks only (node-local disks, or a shared file system's cache, answer differently "
                "elsewhere)")

    def _clock_read(self, node: ast.AST) -> str | None:
        if self._clock(node) or isinstance(node, (ast.Name, ast.Attribute)) and dotted(node) in self.clocks:
            return ("this process's own clock (each rank reads its own time, and the ranks pass a limit at "
                    "different steps)")
        return None

    def _fill(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in FILL_METHODS) and not node.args and not node.keywords:
            if dotted(node.func.value) in self.filled:
                return (f"the fill level of `{ast.unparse(node.func.value)}`, which each rank fills with its "
                        "own data")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and (
                len(node.args) == 1 and dotted(node.args[0]) in self.filled):
            return f"the length of `{ast.unparse(node.args[0])}`, which each rank fills with its own data"
        return None

    def _empty(self, node: ast.AST) -> str | None:
        subject: ast.expr | None = None
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            right = node.comparators[0]
            if isinstance(node.ops[0], (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and (
                    right.value is None):
                subject = node.left
            elif isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Lt, ast.LtE)) and isinstance(
                    right, ast.Constant) and isinstance(node.left, ast.Call) and (
                    right.value == (1 if isinstance(node.ops[0], ast.Lt) else 0)):
                func = node.left.func
                if dotted(func) == "len" and node.left.args:
                    subject = node.left.args[0]
                elif isinstance(func, ast.Attribute) and func.attr == "numel":
                    subject = func.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            subject = node.operand
        if isinstance(subject, ast.Name) and subject.id in self.batches:
            return f"whether this rank's batch `{subject.id}` is empty (the ranks' shards differ)"
        return None
