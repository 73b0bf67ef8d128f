"""Whether a value holds a rank of its process, followed through the names of its function: the path of
a save that each process writes for itself (`os.path.join(out, f"state{gpu}.pt")`, a name bound to one).

What holds a rank is `ranks.RankNames`' answer (names, attributes, calls, environment variables, the
project's helpers), and one fact of the launch: `torch.multiprocessing.spawn(fn, ...)` calls `fn(i, *args)`
with the index of the process on its node, so `fn`'s first parameter is a local rank whatever its name.
"""

from __future__ import annotations

import ast
import bisect
from typing import TYPE_CHECKING

from .ranks import RankNames
from .source import child_nodes, last_name
from .values import Values

if TYPE_CHECKING:
    from .source import SourceFile

# The launchers that call their function with the process index first (torch.multiprocessing's `spawn`
# and `start_processes`, re-exported by `torch.multiprocessing` as `mp`).
SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
                      "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.spawn.start_processes"})
WORLD_SIZES = frozenset({"num_replicas", "num_processes", "nprocs"})  # step names of a world size
MAX_LINKS = 4  # names followed back from the path: `file = join(dir, name)`, `name = f"...{rank}"`
# Calls whose value is new at each call, so a path holding one is each process's own as much as a rank
# would make it (`f"{out}/batch-{uuid4()}.pt"`, a `tempfile.mkstemp()` name, the process id).
PER_CALL = frozenset({"uuid.uuid1", "uuid.uuid4", "tempfile.mkstemp", "tempfile.mkdtemp", "tempfile.mktemp",
                      "tempfile.NamedTemporaryFile", "tempfile.TemporaryDirectory", "tempfile.TemporaryFile",
                      "tempfile.SpooledTemporaryFile", "os.getpid", "time.time_ns", "secrets.token_hex"})
_PER_CALL_NAMES = frozenset({"uuid1", "uuid4", "mkstemp", "mkdtemp", "getpid", "time_ns", "token_hex",
                             "NamedTemporaryFile", "TemporaryFile"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


def spawned_ranks(source: SourceFile) -> dict[str, str]:
    """The functions of the file passed to `mp.spawn` (by name), each with its first parameter: a process
    index on the node."""
    found: dict[str, str] = getattr(source, "_spawned_ranks", None) or {}
    if hasattr(source, "_spawned_ranks"):
        return found
    if "spawn" in source.text or "start_processes" in source.text:
        defined = source.module_functions
        for call in source.calls:
            if source.resolve(call.func) not in SPAWNERS:
                continue
            fn = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "fn"), None)
            func = defined.get(fn.id) if isinstance(fn, ast.Name) else None
            params = [*func.args.posonlyargs, *func.args.args] if func is not None else []
            if func is not None and params:
                found[func.name] = params[0].arg
    source._spawned_ranks = found  # type: ignore[attr-defined]
    return found


def holds_rank(source: SourceFile, value: ast.expr) -> bool:
    """Whether `value` is built from a rank of the process that computes it, directly or through the
    names its function binds (each name's every binding followed, a few links deep)."""
    func = enclosing_function(source, value)
    body = func.body if func is not None else source.tree.body
    # the project's helpers too (`dp_rank = mpu.get_data_parallel_rank()`, returning its group's rank)
    from .summaries import RankReturns  # (summaries reads rank paths itself)

    helpers = RankReturns(source) if source.project is not None else None
    names = RankNames(body, RankNames(source.tree.body, helpers=helpers) if func is not None else None,
                      helpers=helpers)
    spawned = spawned_ranks(source).get(func.name) if func is not None else None
    scope = Values(source, body, func, names)
    unread = _unread_bindings(body)  # what the core binds to nothing: strided loops, `with` targets

    def holds(expr: ast.AST, depth: int, seen: frozenset[str]) -> bool:
        if isinstance(expr, ast.IfExp):  # `a if final else b`: each value it may take must hold one
            return holds(expr.body, depth, seen) and holds(expr.orelse, depth, seen)
        if isinstance(expr, ast.Name):
            if expr.id == spawned or names.role(expr) is not None:
                return True
            # a name holds a rank if every value bound to it that may reach this use does (`path =
            # join(dir, f"s{rank}.pt")`): the core's reaching bindings, so one rebound on every path
            # before the use does not count (`path = root()` … `path = join(path, f"r{rank}")` … `save(path)`)
            # and a binding the checker cannot read makes it not hold one. A parameter rebound on some
            # path (`if rank_str == "": rank_str = f"dp{rank}"`) is read by its rebinding: what callers pass
            # is theirs to say, and a parameter alone holds no rank the function shows.
            if depth >= MAX_LINKS or expr.id in seen:
                return False
            values = [bound.value if bound.value is not None else unread.get((bound.line, expr.id))
                      for bound in scope.at(expr).get(expr.id, ()) if bound.parameter is None]
            return bool(values) and all(v is not None and holds(v, depth + 1, seen | {expr.id})
                                        for v in values)
        if isinstance(expr, (ast.Attribute, ast.Call)) and names.role(expr) is not None:
            return True
        if isinstance(expr, ast.Call) and _per_call(source, expr.func):
            return True
        return any(holds(child, depth, seen) for child in child_nodes(expr))

    return holds(value, 0, frozenset())


def _unread_bindings(body: list[ast.stmt]) -> dict[tuple[int, str], ast.expr]:
    """The loops of a function's body (not of nested functions or classes) whose variable takes every
    world-size-th index from a start (`for i in range(rank, n, world_size)`), by line: the core binds a loop
    variable to nothing it can read, this is what it holds for the rank question (by line and name). So
    for a `with` target, what its context call makes (`with tempfile.NamedTemporaryFile() as tmp`)."""
    found: dict[tuple[int, str], ast.expr] = {}
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.target, ast.Name) and (
                (start := _strided_start(node.iter)) is not None):
            found[(node.lineno, node.target.id)] = start
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if isinstance(item.optional_vars, ast.Name) and isinstance(item.context_expr, ast.Call):
                    found[(node.lineno, item.optional_vars.id)] = item.context_expr
        stack.extend(child_nodes(node))
    return found


def _strided_start(loop: ast.expr) -> ast.expr | None:
    """`range(first + rank, end, world_size)`: each process takes every world-size-th index from its own
    start, so the indices of two processes never meet, and the loop variable holds the rank as much as
    its start does (the start is returned for that question). A range with another step may overlap."""
    if not (isinstance(loop, ast.Call) and isinstance(loop.func, ast.Name) and loop.func.id == "range"
            and len(loop.args) == 3 and not loop.keywords):
        return None
    words = {node.id if isinstance(node, ast.Name) else node.attr for node in ast.walk(loop.args[2])
             if isinstance(node, (ast.Name, ast.Attribute))}
    return loop.args[0] if any("world_size" in w or w in WORLD_SIZES for w in words) else None


def _per_call(source: SourceFile, func: ast.expr) -> bool:  # (or per process)
    """A call of one of `PER_CALL` (`uuid.uuid4().hex` is read as the call `uuid.uuid4()` inside it), or of
    a function of that name from elsewhere (`from lhotse.utils import uuid4`, a wrapper of the standard one,
    imported inside the function)."""
    qualname = source.resolve(func) or ""
    name = (qualname or last_name(func)).rsplit(".", 1)[-1]
    # a helper that returns this process's ranks (`parallel_state.get_all_ranks()`, "tp_dp_pp" ranks as
    # text) names the process in the path as much as one rank does
    return qualname in PER_CALL or name in _PER_CALL_NAMES or name.startswith("get_") and name.endswith(
        ("_rank", "_ranks"))


def enclosing_function(source: SourceFile, node: ast.AST) -> Function | None:
    """The innermost function whose lines hold `node` (the functions of the file listed once, the answer
    kept per line: rules ask for it once per attribute or save they read)."""
    line = getattr(node, "lineno", 0)
    cache: dict[int, Function | None] | None = source.__dict__.get("_enclosing")
    if cache is None:
        cache = source.__dict__["_enclosing"] = {}
    if line in cache:
        return cache[line]
    spans = _function_spans(source)
    inner: Function | None = None
    # The functions holding a line nest, so the innermost is the last one to start at or before it.
    for i in range(bisect.bisect_right(spans.starts, line) - 1, -1, -1):
        func = spans.functions[i]
        if line <= (func.end_lineno or func.lineno):
            inner = func
            break
    cache[line] = inner
    return inner


class _Spans:
    def __init__(self, functions: list[Function]):
        self.functions = sorted(functions, key=lambda f: f.lineno)
        self.starts = [f.lineno for f in self.functions]


def _function_spans(source: SourceFile) -> _Spans:
    """The functions `enclosing_function` can answer: in module, class, function and compound-statement
    bodies (not in expressions, nor in `except` handlers or `with` items)."""
    found: _Spans | None = source.__dict__.get("_enclosing_spans")
    if found is not None:
        return found
    functions: list[Function] = []
    stack: list[ast.AST] = list(source.tree.body)
    while stack:
        current = stack.pop()
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(current)
            stack.extend(current.body)
        elif isinstance(current, ast.ClassDef):
            stack.extend(current.body)
        elif isinstance(current, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            stack.extend(child_nodes(current))
    found = source.__dict__["_enclosing_spans"] = _Spans(functions)
    return found
