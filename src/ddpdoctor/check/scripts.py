"""Does a script's `if __name__ == "__main__":` block start the distributed program, or one process?

A tree holds the training script and, beside it, scripts run by hand as one process (`python export.py`,
`python decode.py`, a benchmark of a save helper). They share the program's modules, so a helper's save
that such a block reaches is not one that every rank runs: the block is the program's entry point only
when the run it starts is distributed. That is when the script shows a marker itself (it makes the process
group, wraps a model in DDP, builds a launcher-driven trainer: `ModuleSummary.launched` & co.), or when what
its block calls, at any depth through project functions, reaches a module that makes the group
(`init_process_group`, DeepSpeed's `init_distributed`: `from engine import main; main()`) or that a launcher
drives without making one (a Hugging Face or DeepSpeed trainer module). A module that only wraps a model
in DDP for its callers (a `smart_DDP()` helper in a utility module) is no such evidence: a DDP wrap needs a
group that something else makes. Code outside the block runs wherever the module is imported, and is not
judged here.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from .facts import ModuleSummary, Target
from .scope import MODULE
from .source import child_nodes

if TYPE_CHECKING:
    from .callgraph import CallGraph
    from .source import SourceFile

MAX_REACHED = 2000  # functions walked from one block: a bound on the walk, not a verdict


def is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"`."""
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and (
        test.left.id == "__name__") and any(isinstance(c, ast.Constant) and c.value == "__main__"
                                            for c in test.comparators)


def main_block(tree: ast.Module) -> tuple[int, int] | None:
    """The lines of the module's top-level `if __name__ == "__main__":` block (the first, if several)."""
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and is_main_test(stmt.test):
            return stmt.lineno, stmt.end_lineno or stmt.lineno
    return None


def handed_on(tree: ast.Module) -> tuple[tuple[str, int], ...]:
    """The module's functions that its module-level code passes by name to a call (`fire.Fire(main)`,
    `mp.spawn(main, ...)`, `Process(target=main)`), with the call's line: they run where that code runs."""
    functions = {stmt.name for stmt in tree.body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found: list[tuple[str, int]] = []
    stack: list[ast.AST] = [s for s in tree.body if not isinstance(
        s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            found.extend((arg.id, node.lineno) for arg in (*node.args, *(k.value for k in node.keywords))
                         if isinstance(arg, ast.Name) and arg.id in functions)
        stack.extend(child_nodes(node))
    return tuple(sorted(found))


# a launcher's flags for several machines (`--nnodes=4`, `--nnodes={n}`, `--node_rank={i}`; not `--nnodes=1`)
MULTI_NODE = re.compile(r"--nnodes(?![= ]*1\b)|--node[_-]rank")
SCRIPT = re.compile(r"[\w./-]+\.py\b")


def node_launches(tree: ast.Module) -> tuple[tuple[str, int], ...]:
    """The scripts a launcher module starts on several machines: the `.py` names in its strings, when its
    strings also pass a launcher's multi-node flags (`python -m torch.distributed.launch --nnodes={n}
    --node_rank={i} train.py`), with the line that names each."""
    pieces = [(node.value, node.lineno) for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    if not any(MULTI_NODE.search(text) for text, _ in pieces):
        return ()
    return tuple(sorted({(name, line) for text, line in pieces for name in SCRIPT.findall(text)}))


def launched_on_nodes(graph: CallGraph, path: str) -> tuple[str, int] | None:
    """The project file and line that start `path` on several machines (`node_launches`), if any."""
    parts = path.replace("\\", "/").split("/")
    for module in graph.modules.values():
        for name, line in module.node_launches:
            named = name.lstrip("./").split("/")
            if parts[-len(named):] == named and module.path != path:
                return module.path, line
    return None


def in_main_block(module: ModuleSummary, line: int) -> bool:
    block = module.main_block
    return block is not None and block[0] <= line <= block[1]


def shows_marker(module: ModuleSummary) -> bool:
    """The module's own code makes the run distributed."""
    return module.launched or module.makes_group or module.manual_ddp or module.lightning_processes


def starts_program(module: ModuleSummary) -> bool:
    """Reaching this module's functions starts a distributed run: it makes the group, or a launcher drives
    it without one being made by hand (a marker but no DDP code of its own)."""
    return module.makes_group or (module.launched and not module.manual_ddp)


def block_is_distributed(graph: CallGraph, path: str, memo: dict[str, bool]) -> bool:
    """The `__main__` block of `path` starts a distributed run (module docstring; memoised in `memo`)."""
    if path not in memo:
        memo[path] = _block_is_distributed(graph, path)
    return memo[path]


def _block_is_distributed(graph: CallGraph, path: str) -> bool:
    module = graph.modules.get(path)
    if module is None or module.main_block is None or shows_marker(module):
        return True
    start = module.functions.get(MODULE)
    calls = start.calls if start is not None else ()
    frontier = [site.target for site in calls if in_main_block(module, site.line)] + [
        Target(path, name) for name, line in module.handed_on if in_main_block(module, line)]
    seen: set[Target] = set()
    while frontier and len(seen) < MAX_REACHED:
        target = frontier.pop()
        if target in seen:
            continue
        seen.add(target)
        found = graph.function(target)
        if found is None:
            continue
        where = graph.modules.get(found[0].path)
        if where is not None and where.path != path and starts_program(where):
            return True
        frontier.extend(site.target for site in found[1].calls)
    return False


def own_script_block(source: SourceFile) -> frozenset[int]:
    """The nodes of `if __name__ == "__main__":` in a module that is distributed only because a DDP program
    imports it, when the block starts one process (it shows no marker itself and reaches no
    module that makes the group): that block runs when the file is started as a script of its own, not in
    the program's processes. (DDP601's question, kept here beside the reading of script blocks.)"""
    from .program import accelerate_trains

    project = source.project
    own = project.modules.get(source.path) if project is not None else None
    if source.manual_ddp or own is None or project is None or accelerate_trains(source) or (
            block_is_distributed(project, source.path, project.distributed_blocks)):
        return frozenset()  # its own script is the program (an `accelerate launch` script, a DDP script)
    return frozenset(id(node) for stmt in source.tree.body if isinstance(stmt, ast.If)
                     and is_main_test(stmt.test) for node in ast.walk(stmt))
