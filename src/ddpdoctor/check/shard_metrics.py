"""Metrics summed over one rank's shard outside Lightning: a helper that accumulates over the loader it is
given (`total += ...` in `for x, y in loader:`) and returns the sums, called with a loader whose
`DistributedSampler` gives this rank its share of the data only, whose result decides something (compared
with the best so far: `if score < best:`) with no reduction across ranks between the sum and the use. DDP103
asks it for plain training loops, as `epoch_outputs.py` reads a LightningModule's hooks."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .metric_words import GATHER_WORDS
from .samplers import is_distributed_sampler
from .source import SourceFile, call_name, keyword, statements

_REDUCERS = (*GATHER_WORDS, "reduce")


@dataclass(frozen=True)
class ShardMetric:
    call: ast.Call  # the helper's call with a sharded loader
    loader: str  # the loader's name
    used: ast.Compare  # where the result decides something


def shard_metrics(source: SourceFile) -> Iterator[ShardMetric]:
    """The calls of this file's accumulating helpers with a rank-sharded loader whose result is compared
    in the calling function before any reduction (module docstring)."""
    if "DistributedSampler" not in source.text or "+=" not in source.text:
        return
    loaders = _sharded_loaders(source)
    helpers = _accumulating_helpers(source)
    if not loaders or not helpers:
        return
    seen: set[int] = set()
    for function in [source.tree, *(n for n in statements(source.tree.body)
                                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        body = function.body
        for stmt in statements(body):
            if id(stmt) in seen:
                continue  # the module's walk reaches into its functions: each call is read in its own
            seen.add(id(stmt))
            if not isinstance(stmt, ast.Assign):
                continue
            call = stmt.value
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id in helpers):
                continue
            position, name = helpers[call.func.id]
            given = call.args[position] if position < len(call.args) else (
                kw.value if (kw := keyword(call, name)) is not None else None)
            if not (isinstance(given, ast.Name) and given.id in loaders):
                continue
            results = {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            used = _decided(body, stmt, results)
            if used is not None:
                yield ShardMetric(call, given.id, used)


def _sharded_loaders(source: SourceFile) -> set[str]:
    """Names bound to a `DataLoader` whose `sampler` is a DistributedSampler (made there, or a name bound to
    one), whatever it shuffles: each rank reads its own share."""
    samplers: set[str] = set()
    loaders: set[str] = set()
    for node in ast.walk(source.tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if is_distributed_sampler(node.value, source):
            samplers.update(names)
        elif call_name(node.value).endswith("DataLoader") and (sampler := keyword(node.value, "sampler")):
            value = sampler.value
            if is_distributed_sampler(value, source) or isinstance(value, ast.Name) and value.id in samplers:
                loaders.update(names)
    return loaders


def _accumulating_helpers(source: SourceFile) -> dict[str, tuple[int, str]]:
    """Top-level functions that loop over a parameter adding into locals (`total += loss.item()`), return
    what they added, and reduce nothing across ranks: name → (the parameter's position, its name)."""
    found: dict[str, tuple[int, str]] = {}
    for function in source.tree.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in function.args.args]
        calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
        if any(any(word in call_name(c) for word in _REDUCERS) for c in calls):
            continue  # the sums are reduced (or gathered) before they are returned
        for loop in ast.walk(function):
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            walked = loop.iter.args[0] if isinstance(loop.iter, ast.Call) and call_name(loop.iter) in (
                "enumerate", "tqdm") and loop.iter.args else loop.iter
            if not (isinstance(walked, ast.Name) and walked.id in params):
                continue
            sums = {n.target.id for s in loop.body for n in ast.walk(s) if isinstance(n, ast.AugAssign)
                    and isinstance(n.op, ast.Add) and isinstance(n.target, ast.Name)}
            returned = {n.id for r in ast.walk(function) if isinstance(r, ast.Return) and r.value is not None
                        for n in ast.walk(r.value) if isinstance(n, ast.Name)}
            if sums & returned:
                found[function.name] = (params.index(walked.id), walked.id)
                break
    return found


def _decided(body: list[ast.stmt], call: ast.stmt, results: set[str]) -> ast.Compare | None:
    """The first comparison after `call` in the function that reads its results, directly or through a
    name computed from them (`score = total / count`), with no reduction in between."""
    names = set(results)
    for stmt in statements(body):
        if stmt.lineno <= call.lineno:
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and any(word in call_name(node) for word in _REDUCERS):
                return None  # reduced (or gathered) first
        if isinstance(stmt, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id in names for n in ast.walk(stmt.value)):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        test = stmt.test if isinstance(stmt, (ast.If, ast.While)) else None
        if test is not None:
            for node in ast.walk(test):
                if isinstance(node, ast.Compare) and any(
                        isinstance(n, ast.Name) and n.id in names for n in ast.walk(node)) and all(
                        isinstance(op, (ast.Lt, ast.Gt, ast.LtE, ast.GtE)) for op in node.ops):
                    return node
    return None


