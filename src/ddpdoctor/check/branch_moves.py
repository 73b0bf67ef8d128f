"""DDP101's safe fix: a `self.log(..., sync_dist=True)` under a rank test moves out of the branch, so that
every rank logs (and syncs) the value.

The edit is offered only where the program is provably the same apart from the other ranks now logging too:

- the call is a statement of its own directly in the body of the `if` that is the rank test (no `else`, no
  `elif`), and it is among the first or the last statements of that body: logs before the first other
  statement move above the `if`, logs after the last one move below it, in their order. The other
  statements stay under the test. A log between two other statements is not moved (what they do may change
  what it reads), nor is one carrying a `# noqa`;
- what the call reads is the same on every rank: constants, the function's parameters (`self`), names
  assigned on every path to the `if` (before it, outside any other branch) and nowhere else in the
  function, attributes and items of those, arithmetic on them; no call (which might do anything on the other
  ranks) and no `self.<attr>` that the class assigns under a rank test;
- where logs move above the `if` (or the whole `if` goes, every statement of it being such a log), the
  test is evaluated later or not at all: it must have no effect of its own (names, attributes, comparisons,
  the rank getters).

All the moved logs of one `if` are rewritten by one edit, shared by their findings: the findings are fixed
together or not at all, and the edits of one `if` never overlap.
"""

from __future__ import annotations

import ast
import builtins
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..findings import Applicability, Edit, Fix

if TYPE_CHECKING:
    from .guards import GuardedCall
from .rank_sources import GLOBAL_ZERO_FLAGS, RANK_METHODS, RANK_WORDS, Function, rank_zero_decorator
from .source import SourceFile, child_nodes, dotted, is_true, keyword

# Calls a rank test may make and still have no effect: reading a rank, a flag, the environment.
_PURE_TEST_CALLS = RANK_METHODS | GLOBAL_ZERO_FLAGS | {"int", "get", "getenv", "is_initialized",
                                                       "is_available", "get_world_size"}
_OPERAND_NODES = (ast.Constant, ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.Dict,
                  ast.Set, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.JoinedStr, ast.FormattedValue,
                  ast.Slice, ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


@dataclass(frozen=True)
class _Plan:
    """The logs of one `if` that move, and where: `before` (above the `if`), `after` (below it)."""

    branch: ast.If
    before: tuple[ast.Expr, ...]
    after: tuple[ast.Expr, ...]


def move_out_of_branch(source: SourceFile, call: ast.Call, branch: ast.If | None,
                       function: Function | None) -> tuple[Edit, ...]:
    """The edits that move the statement of `call` (a sync_dist log) out of `branch`, or () where the move
    cannot be shown to change nothing but the other ranks logging too."""
    if branch is None or function is None or branch.orelse:
        return ()
    if not source.lines[branch.lineno - 1].lstrip().startswith("if"):  # an `elif`: nowhere to move it
        return ()
    plan = _plan(source, branch, function)
    if plan is None or not any(stmt.value is call for stmt in (*plan.before, *plan.after)):
        return ()
    return _edits(source, plan)


def _plan(source: SourceFile, branch: ast.If, function: Function) -> _Plan | None:
    stable = _StableNames(source, branch, function)
    movable = [_movable(source, stmt, stable) for stmt in branch.body]
    first_other = next((i for i, ok in enumerate(movable) if not ok), len(movable))
    last_other = max((i for i, ok in enumerate(movable) if not ok), default=-1)
    before: list[ast.Expr] = [s for s in branch.body[:first_other] if isinstance(s, ast.Expr)]
    after: list[ast.Expr] = [s for s in branch.body[last_other + 1:] if isinstance(s, ast.Expr)]
    if first_other == len(movable):  # every statement moves: the `if` goes
        after = []
    if before and not _pure(branch.test):
        before = []
        if first_other == len(movable):
            return None
    if not before and not after:
        return None
    return _Plan(branch, tuple(before), tuple(after))


def _movable(source: SourceFile, stmt: ast.stmt, stable: _StableNames) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    if not is_true(getattr(keyword(call, "sync_dist"), "value", None)) or keyword(call, "rank_zero_only"):
        return False
    if any(kw.arg is None for kw in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    if not _own_lines(source, stmt) or "noqa" in source.text_of(stmt).lower():
        return False
    parts = [call.func, *call.args, *(kw.value for kw in call.keywords)]
    return isinstance(call.func, ast.Attribute) and all(stable.reads_only_stable(part) for part in parts)


def _pure(test: ast.expr) -> bool:
    """The test has no effect of its own (it may be evaluated later, or not at all)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in _PURE_TEST_CALLS or node.keywords and name != "get":
                return False
        elif isinstance(node, (ast.NamedExpr, ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom)):
            return False
    return True


def _own_lines(source: SourceFile, stmt: ast.stmt) -> bool:
    """The statement has its lines to itself: nothing before it on its first line, only a comment after
    it on its last, and no string that spans lines (dedenting would change it)."""
    first = source.lines[stmt.lineno - 1].encode("utf-8")[:stmt.col_offset]
    if first.strip():
        return False
    end_line = stmt.end_lineno or stmt.lineno
    last = source.lines[end_line - 1].encode("utf-8")[stmt.end_col_offset or 0:]
    rest = last.decode("utf-8", errors="replace").strip()
    if rest and not rest.startswith("#"):
        return False
    return not any(token.type == tokenize.STRING and token.start[0] != token.end[0]
                   for token in _tokens(source.text_of(stmt)))


def _tokens(text: str) -> Iterator[tokenize.TokenInfo]:
    try:
        yield from tokenize.generate_tokens(io.StringIO(text).readline)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        yield tokenize.TokenInfo(tokenize.STRING, "", (0, 0), (1, 0), "")  # unreadable: treated as unsafe


class _StableNames:
    """Which names the statements of `branch` may read and get the same kind of value on every rank."""

    def __init__(self, source: SourceFile, branch: ast.If, function: Function):
        self.source, self.branch, self.function = source, branch, function
        parameters = function.args
        self.parameters = {a.arg for a in (*parameters.posonlyargs, *parameters.args, *parameters.kwonlyargs,
                                            *(p for p in (parameters.vararg, parameters.kwarg) if p))}
        self.dominating = _dominating_assignments(function, branch)
        self.bindings = _bindings(function)
        self.module_names = _module_names(source.tree)

    def reads_only_stable(self, node: ast.expr) -> bool:
        for part in ast.walk(node):
            if not isinstance(part, _OPERAND_NODES):
                return False
            if isinstance(part, ast.Name) and not self._stable(part.id):
                return False
            if isinstance(part, ast.Attribute) and not self._attribute_stable(part):
                return False
        return True

    def _stable(self, name: str) -> bool:
        bound = self.bindings.get(name, [])
        if name in self.parameters:
            return not bound
        if bound:
            return all(id(node) in self.dominating for node in bound)
        return name in self.module_names or hasattr(builtins, name)

    def _attribute_stable(self, node: ast.Attribute) -> bool:
        """`self.x` is not stable where the class assigns `self.x` under a rank test (rank 0's alone)."""
        name = dotted(node)
        if name is None or not name.startswith("self."):
            return True
        return name.split(".")[1] not in _rank_assigned_attributes(self.source)


def _dominating_assignments(function: Function, branch: ast.If) -> set[int]:
    """ids of the plain assignments every path from the function's start to `branch` passes: those before it
    in its own block, and before each enclosing statement in theirs."""
    found: set[int] = set()

    def search(block: list[ast.stmt]) -> bool:
        for index, stmt in enumerate(block):
            inside = stmt is branch or any(
                isinstance(child, list) and child and isinstance(child[0], ast.stmt) and search(child)
                for _, child in ast.iter_fields(stmt) if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef,
                                                                               ast.AsyncFunctionDef)))
            if inside:
                found.update(id(s) for s in block[:index] if isinstance(s, (ast.Assign, ast.AnnAssign)))
                if isinstance(stmt, (ast.For, ast.AsyncFor)):
                    found.add(id(stmt))  # the loop's own target, bound before its body runs
                return True
        return False

    search(function.body)
    return found


def _bindings(function: Function) -> dict[str, list[ast.AST]]:
    """Each name the function binds -> the statements (or nodes) that bind it. A `global`, `nonlocal`,
    `del`, `with ... as`, import, walrus or handler binding is recorded by its own node, which never
    dominates."""
    found: dict[str, list[ast.AST]] = {}

    def record(target: ast.AST, owner: ast.AST) -> None:
        """The names a target binds (`a`, `a, *b`), not those it only reads (`self` of `self.x = ...`)."""
        if isinstance(target, ast.Name):
            found.setdefault(target.id, []).append(owner)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                record(element, owner)
        elif isinstance(target, ast.Starred):
            record(target.value, owner)

    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(node)
            continue  # their insides are another scope
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                record(target, node)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            record(node.target, node)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            record(node.target, node)
        elif isinstance(node, (ast.AugAssign, ast.Delete, ast.withitem, ast.NamedExpr)):
            for target in getattr(node, "targets", None) or [
                getattr(node, "target", None) or getattr(node, "optional_vars", None)
            ]:
                if target is not None:
                    record(target, node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found.setdefault((alias.asname or alias.name).split(".")[0], []).append(node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                found.setdefault(name, []).append(node)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.setdefault(node.name, []).append(node)
        stack.extend(child_nodes(node))
    return found


def _module_names(tree: ast.Module) -> set[str]:
    """Names the module binds at its top level outside any branch: imports, classes, functions, plain
    assignments."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _rank_assigned_attributes(source: SourceFile) -> set[str]:
    """`x` of every `self.x = ...` under an `if` whose test names a rank word, or in a function decorated
    to run on rank 0 only (a text test: it may refuse a move it could make, never the reverse)."""
    found: set[str] = set()
    for node in ast.walk(source.tree):
        if isinstance(node, ast.If) and any(w in source.segment(node.test) for w in RANK_WORDS):
            scopes: list[ast.AST] = [*node.body, *node.orelse]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and rank_zero_decorator(node):
            scopes = [*node.body]
        else:
            continue
        for scope in scopes:
            for inner in ast.walk(scope):
                if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, (ast.Store, ast.Del)):
                    name = dotted(inner)
                    if name and name.startswith("self."):
                        found.add(name.split(".")[1])
    return found


def _edits(source: SourceFile, plan: _Plan) -> tuple[Edit, ...]:
    """One edit for the whole `if`: from the first line that changes to the last."""
    branch, lines = plan.branch, source.lines
    indent = _indent(lines[branch.lineno - 1])
    body_indent = _indent(lines[branch.body[0].lineno - 1])
    if not body_indent.startswith(indent) or body_indent == indent:
        return ()
    cut = len(body_indent) - len(indent)
    header_end = branch.body[0].lineno - 1  # the header's lines, and comments up to the first statement
    header = lines[branch.lineno - 1:header_end]
    whole = len(plan.before) == len(branch.body)
    text: list[str] = []
    start, end = branch.lineno, branch.end_lineno or branch.lineno
    if plan.before:
        moved_end = plan.before[-1].end_lineno or plan.before[-1].lineno
        text += [_dedent(line, cut) for line in lines[header_end:moved_end]]
        if whole:
            text[:0] = [indent + comment + _ending(header[-1]) for comment in _comments(header)]
        else:
            text += header
            text += lines[moved_end:end]
    else:
        text += lines[start - 1:end]
    if plan.after:
        first_after = plan.after[0].lineno
        keep = len(text) - (end - first_after + 1)
        text[keep:] = [_dedent(line, cut) for line in text[keep:]]
    last_line = lines[end - 1]
    replaced = "".join(text)
    ending = _ending(last_line)
    if ending and replaced.endswith(ending):
        replaced = replaced[: -len(ending)]
    return (Edit(source.path, start, 1, end, len(last_line) - len(ending) + 1, replaced),)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")):]


def _dedent(line: str, cut: int) -> str:
    """The line `cut` columns to the left, where it has that much leading whitespace (a continuation line
    inside brackets may have less; it is left as it is)."""
    head = line[:cut]
    return line[cut:] if len(head) == cut and not head.strip() else line


def _comments(header: list[str]) -> list[str]:
    return [token.string for token in _tokens("".join(line.lstrip() for line in header) + "\n    pass\n")
            if token.type == tokenize.COMMENT]


MOVE_OUT = "log on every rank: move the call out of the rank test, so that every rank syncs the value"
RANK_ZERO_ONLY = ("`rank_zero_only=True` instead of `sync_dist=True` to log rank 0's own value, not synced "
                  "(unsafe: the metric is then rank 0's shard only)")


def log_fix(source: SourceFile, guarded: GuardedCall) -> Fix:
    """Safe: the log moves out of the branch and every rank syncs the value (only where that is all
    that changes, check/branch_moves.py). Otherwise `rank_zero_only=True`, which is not safe: it
    logs rank 0's own value, not the synced one."""
    assert guarded.guard is not None
    if not guarded.guard.early_exit:
        moved = move_out_of_branch(source, guarded.call, guarded.guard.branch, guarded.function)
        if moved:
            return Fix(message=MOVE_OUT + f" (or {RANK_ZERO_ONLY})", edits=moved,
                       applicability=Applicability.SAFE)
    message = f"{MOVE_OUT}, or {RANK_ZERO_ONLY}"
    sync = keyword(guarded.call, "sync_dist")
    # With `rank_zero_only=` already there, or `**kwargs` that may hold it, a second one would not compile
    # or would fail at run time: describe the fix, do not apply it.
    if sync is None or keyword(guarded.call, "rank_zero_only") or any(
            kw.arg is None for kw in guarded.call.keywords):
        return Fix(message=message)
    line, column, end_line, end_column = source.span(sync)
    return Fix(message=message, applicability=Applicability.UNSAFE,
               edits=(Edit(source.path, line, column, end_line, end_column, "rank_zero_only=True"),))
