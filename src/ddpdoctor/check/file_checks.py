"""Whether a file test looks for a file the file itself writes on some ranks only (DDP101's per-rank data).

`if train_state_path.exists():` answers differently on the ranks when only rank 0 writes that file
(`if rank == 0: torch.save(state, ckpt_dir / STATE_FILE)`): on node-local disks the other nodes never see
it, and on a shared file system whose attribute cache lags they may not see it yet. A path a user hands in
(`--resume`), or one every rank writes, is taken to look the same everywhere: nothing in the source says
otherwise, and a hedged finding on every `if os.path.isdir(ckpt_dir): load()` would bury the real ones.

The test and the write name the same file when their path expressions share a key: a string literal of
the name (`"state.pt"`, the text of an f-string) or a module constant (`STATE_FILE`), through the names
their functions bind on the way (`path = run_dir / STATE_FILE`). A write is on some ranks only when an `if`
around it reads a rank word (`if rank == 0:`, `if self.is_main_process:`).
"""

from __future__ import annotations

import ast

from .rank_sources import RANK_WORDS
from .source import SourceFile, walk
from .writes import checkpoint_write


def one_rank_file(source: SourceFile, subject: ast.expr, function: ast.AST) -> bool:
    """`subject`, read in `function`, names a file that the source writes under a rank test."""
    keys = _keys(subject, _bindings(function))
    if not keys:
        return False
    return any(keys & written for written in _one_rank_writes(source))


def _one_rank_writes(source: SourceFile) -> list[frozenset[str]]:
    """The keys of each path the file writes inside an `if` that reads a rank word (computed once)."""
    cached: list[frozenset[str]] | None = source.__dict__.get("_one_rank_writes")
    if cached is not None:
        return cached
    found: list[frozenset[str]] = []
    functions = [n for n in walk(source.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for func in functions:
        ranked = [n for n in walk(func) if isinstance(n, ast.If) and any(
            word in ast.unparse(n.test) for word in RANK_WORDS)]
        if not ranked:
            continue
        bound = _bindings(func)
        for branch in ranked:
            for node in (n for stmt in branch.body for n in walk(stmt)):
                if isinstance(node, ast.Call):
                    written = checkpoint_write(source, node)
                    if written is not None and written[1] is not None:
                        found.append(frozenset(_keys(written[1], bound)))
    source.__dict__["_one_rank_writes"] = found
    return found


def _bindings(function: ast.AST) -> dict[str, list[ast.expr]]:
    """What each plain name of a function is bound to (every binding)."""
    bound: dict[str, list[ast.expr]] = {}
    for node in walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            bound.setdefault(node.target.id, []).append(node.value)
    return bound


def _keys(expr: ast.expr, bound: dict[str, list[ast.expr]], depth: int = 3) -> set[str]:
    """The literal names and module constants a path expression is made of, through local bindings."""
    keys: set[str] = set()
    for node in walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value.strip("/")) > 2:
            keys.add(node.value.strip("/"))
        elif isinstance(node, ast.Name):
            if node.id.strip("_").isupper():
                keys.add(node.id)
            elif depth and node.id in bound:
                for value in bound[node.id]:
                    keys |= _keys(value, bound, depth - 1)
        elif isinstance(node, ast.Attribute) and node.attr.strip("_").isupper():
            keys.add(node.attr)
    return keys
