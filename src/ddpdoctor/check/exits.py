"""Early exits: how a block lets some ranks leave (`continue`, `break`, `return`, `sys.exit()`), and which
ranks go on after an `if` whose branches may leave. A `raise` is a crash the launcher reports, not an exit,
but for a re-raise in an `except` handler under a rank test (`failure_raise`: DDP101 hedges it)."""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterator
from dataclasses import dataclass

from .flags import never_true
from .ranks import SOME, RankSet, RankTest
from .source import child_nodes, dotted

EXIT_FUNCTIONS = frozenset({"sys.exit", "os._exit", "exit", "quit"})


class Leave(enum.IntEnum):
    """How far an early exit leaves: the rest of the loop body, the loop, or the function."""

    ITERATION = 1  # continue
    LOOP = 2  # break
    FUNCTION = 3  # return, sys.exit()



@dataclass(frozen=True)
class Exits:
    """The early exits of a block (not counting those of nested loops and functions)."""

    always: bool  # every path through the block leaves
    first: ast.stmt | None  # the first exit, for the message
    leaves: Leave | None  # the farthest one leaves
    kinds: frozenset[Leave] = frozenset()

    @property
    def any(self) -> bool:
        return self.first is not None



def is_exit_call(stmt: ast.stmt) -> bool:
    """`sys.exit(0)`, `exit()`, `os._exit(0)`, `raise SystemExit` as a statement: a clean exit of this
    process, which the launcher takes for a finished worker while the others go on. An exit with a failure
    status (`sys.exit(1)`, `exit("no data")`: a message exits with status 1) is a crash, like a `raise`:
    torchrun stops the other workers when one fails."""
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return dotted(exc) in ("SystemExit", "sys.exit") and not (
            isinstance(stmt.exc, ast.Call) and _fails(stmt.exc))
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and (
        dotted(stmt.value.func) or "") in EXIT_FUNCTIONS and not _fails(stmt.value)


def _fails(call: ast.Call) -> bool:
    """The exit's status is a failure: a non-zero number or a message (a computed status is unknown)."""
    if not call.args:
        return False
    status = call.args[0]
    if isinstance(status, ast.UnaryOp) and isinstance(status.op, ast.USub):
        status = status.operand
    return isinstance(status, ast.Constant) and status.value not in (0, None, False) or isinstance(
        status, ast.JoinedStr)


def exits(body: list[ast.stmt], never: frozenset[str] = frozenset()) -> Exits:
    """`never`: flags the project never raises (flags.py); a branch that needs one to hold is not taken."""
    found: list[tuple[ast.stmt, Leave]] = []
    _collect_exits(body, found, in_loop=False, never=never)
    first = min(found, key=lambda f: (f[0].lineno, f[0].col_offset))[0] if found else None
    return Exits(terminates(body), first, max((leave for _, leave in found), default=None),
                 frozenset(leave for _, leave in found))


def _collect_exits(body: list[ast.stmt], found: list[tuple[ast.stmt, Leave]], in_loop: bool,
                   never: frozenset[str] = frozenset()) -> None:
    for stmt in body:
        if isinstance(stmt, ast.Return) or is_exit_call(stmt):
            found.append((stmt, Leave.FUNCTION))
        elif isinstance(stmt, ast.Continue) and not in_loop:
            found.append((stmt, Leave.ITERATION))
        elif isinstance(stmt, ast.Break) and not in_loop:
            found.append((stmt, Leave.LOOP))
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            _collect_exits(stmt.body, found, in_loop=True, never=never)  # its break/continue are its own
            _collect_exits(stmt.orelse, found, in_loop, never)
        elif isinstance(stmt, ast.If) and never and never_true(stmt.test, never):
            _collect_exits(stmt.orelse, found, in_loop, never)
        else:
            for name in ("body", "orelse", "finalbody"):
                _collect_exits(getattr(stmt, name, None) or [], found, in_loop, never)
            for handler in getattr(stmt, "handlers", ()):
                _collect_exits(handler.body, found, in_loop, never)
            for case in getattr(stmt, "cases", ()):
                _collect_exits(case.body, found, in_loop, never)


# What an environmental failure is caught as: any exception, or the OS's (a download, a read, a socket).
FAILURES = frozenset({"Exception", "BaseException", "OSError", "IOError", "EnvironmentError",
                      "ConnectionError", "TimeoutError", "FileNotFoundError", "PermissionError", "URLError",
                      "HTTPError"})


def failure_raise(body: list[ast.stmt]) -> ast.Raise | None:
    """The first re-raise (`raise`, `raise e`) in a handler of `body` that catches any exception or the OS's
    (not in nested functions): the failure of the work its `try` does (a download, a read) leaves the
    function on this rank only. Unlike a `raise` of its own, or an error it turns into another (a check
    that fails the same way wherever it runs, a crash the launcher reports), a caller may catch it, and a
    library that calls the function (torch.distributed.checkpoint's reader) gathers it first."""
    found: list[ast.Raise] = []
    stack: list[tuple[ast.stmt, str | None]] = [(stmt, None) for stmt in body]
    while stack:
        stmt, caught = stack.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, ast.Raise) and caught is not None and (stmt.exc is None or isinstance(
                stmt.exc, ast.Name) and stmt.exc.id == caught):
            found.append(stmt)
        for name in ("body", "orelse", "finalbody"):
            stack.extend((inner, caught) for inner in getattr(stmt, name, None) or [])
        for handler in getattr(stmt, "handlers", ()):
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            if all(t is None or (dotted(t) or "").rsplit(".", 1)[-1] in FAILURES for t in types):
                stack.extend((inner, handler.name or "") for inner in handler.body)
    return min(found, key=lambda r: (r.lineno, r.col_offset)) if found else None


def terminates(body: list[ast.stmt]) -> bool:
    """Every path through `body` leaves by `return`, `continue`, `break` or `sys.exit()` (a `raise` is a
    crash that the launcher reports, not a way for some ranks to skip ahead)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Continue, ast.Break)) or is_exit_call(last):
        return True
    if isinstance(last, ast.If):
        return terminates(last.body) and terminates(last.orelse)
    return False


def continuing(test: RankTest, body: Exits, orelse: Exits) -> RankSet | None:
    """The processes that go on after an `if` whose branches may leave, when that is not every rank."""
    if body.always and orelse.always:
        return None  # nothing after it runs
    if body.any and orelse.any and body.kinds == orelse.kinds:
        return None  # both sides may leave the same way: on a test they share (`if done: break` in each)
    rest = (
        test.orelse
        if body.always and not orelse.any
        else test.then
        if orelse.always and not body.any
        else None
    )
    if rest is not None and rest.restricted:
        return rest
    if test.then.restricted and body.any or test.orelse.restricted and orelse.any:
        return SOME  # every rank but some of those that took the leaving branch
    return None



def _exit_word(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.Return):
        return "return"
    if isinstance(stmt, ast.Continue):
        return "continue"
    if isinstance(stmt, ast.Break):
        return "break"
    if isinstance(stmt, ast.Raise):
        return "raise SystemExit" if is_exit_call(stmt) else "raise"
    assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
    return f"{dotted(stmt.value.func)}()"



def branch_calls(stmts: list[ast.stmt]) -> Iterator[ast.Call]:
    """Calls in a statement list, in source order, not descending into nested functions or lambdas."""
    for stmt in stmts:
        stack: list[ast.AST] = [stmt]
        found: list[ast.Call] = []
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(node, ast.Call):
                found.append(node)
            stack.extend(child_nodes(node))
        found.sort(key=lambda c: (c.lineno, c.col_offset))
        yield from found

