"""Whether the program catches the error a collective is raising: a `try` whose handler names the error
(`except RuntimeError`, `except dist.DistBackendError`, a bare `except`) and does not raise again, or a
`with` that expects it (`self.assertRaises(RuntimeError)`, `pytest.raises(...)`, `contextlib.suppress`).

Read from the source of the frames between the collective and the test runner or launcher that called
them, once per failure (never on the hot path). A test runner's or a process wrapper's catch-all (unittest,
pytest, torch's multi-process test harness, multiprocessing) reports the error; it does not handle it, and
the walk stops there."""

from __future__ import annotations

import ast
import linecache
import os
from types import FrameType

from ...callsite import classify

# What a failing collective raises (DistBackendError and its siblings are RuntimeErrors), and the bases a
# handler may name instead
_ERRORS = frozenset({
    "RuntimeError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "Exception",
    "BaseException",
})
# Context managers that swallow the error they are given
_EXPECTING = frozenset({"assertRaises", "assertRaisesRegex", "raises", "suppress"})
# Where the walk stops: frames of test runners and process wrappers (their catch-all reports, exits)
_HARNESS = (
    os.sep + "unittest" + os.sep, os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep,
    os.sep + "multiprocessing" + os.sep, os.sep + "runpy.py",
    os.sep + "common_distributed.py", os.sep + "common_utils.py",
)
_DISTRIBUTED = os.sep + "torch" + os.sep + "distributed" + os.sep
MAX_FRAMES = 24
MAX_SOURCE = 2_000_000  # characters: a generated file this large is not parsed

_trees: dict[str, ast.Module | None] = {}


def caught_by_program(frame: FrameType | None) -> bool:
    """Whether a frame from `frame` outward, up to the first harness frame, handles the collective's error."""
    steps = 0
    while frame is not None and steps < MAX_FRAMES:
        path = frame.f_code.co_filename
        if any(marker in path for marker in _HARNESS):
            return False
        if _DISTRIBUTED not in path and classify(path)[0] != 0 and _handles_at(path, frame.f_lineno):
            return True
        frame = frame.f_back
        steps += 1
    return False


def _handles_at(path: str, line: int | None) -> bool:
    tree = _tree(path)
    if tree is None or line is None:
        return False
    return any(_handles(node, line) for node in ast.walk(tree) if isinstance(node, (ast.Try, ast.With)))


def _handles(node: ast.Try | ast.With, line: int) -> bool:
    body = node.body
    if not body or not body[0].lineno <= line <= (body[-1].end_lineno or body[-1].lineno):
        return False
    if isinstance(node, ast.With):
        return any(_expects_error(item.context_expr) for item in node.items)
    return any(_names_error(handler.type) and not _raises_again(handler) for handler in node.handlers)


def _expects_error(expr: ast.expr) -> bool:
    if not isinstance(expr, ast.Call) or _last_name(expr.func) not in _EXPECTING:
        return False
    return not expr.args or _names_error(expr.args[0])


def _names_error(expr: ast.expr | None) -> bool:
    if expr is None:  # a bare `except:`
        return True
    if isinstance(expr, ast.Tuple):
        return any(_names_error(item) for item in expr.elts)
    return _last_name(expr) in _ERRORS


def _raises_again(handler: ast.ExceptHandler) -> bool:
    """A handler that ends in `raise` passes the error on (logs it, wraps it): it does not handle it."""
    return bool(handler.body) and isinstance(handler.body[-1], ast.Raise)


def _last_name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _tree(path: str) -> ast.Module | None:
    if path in _trees:
        return _trees[path]
    tree: ast.Module | None = None
    lines = linecache.getlines(path)
    source = "".join(lines)
    if source and len(source) <= MAX_SOURCE:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            tree = None
    _trees[path] = tree
    return tree
