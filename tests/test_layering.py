"""The layering of src/ddpdoctor as docs/architecture.md describes it: no new import cycle between its
top-level packages, none of the imports the map rules out inside one, and every module named in the map.

An import inside a function is an import too: it only moves the cycle from import time to call time. The
cycles that exist today are listed in KNOWN_CYCLIC with what would break each; one that is broken must leave
the list (the test says so), and a new one fails the test."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "ddpdoctor"
ARCHITECTURE = PACKAGE.parent.parent / "docs" / "architecture.md"

# Imports that lie on a cycle today (importer -> imported top-level package): none. (The last, audits <->
# guard, ended when the guard began to hand the audits an AuditContext: audits/context.py.)
KNOWN_CYCLIC: set[tuple[str, str]] = set()

# Folders whose modules must not import from another folder of the package, and why.
FORBIDDEN = {
    ("guard/judge", "guard/rank"): "the judging is pure, shared by the ranks and the launcher",
    ("audits", "guard"): "the guard installs the audits and hands them what they need (audits/context.py)",
    ("render", "guard"): "render reads reports.py and records.py, never the producers",
    ("render", "explain"): "render reads reports.py and the catalogue, never the producers",
    ("render", "audits"): "render reads reports.py, never the producers",
    ("render", "commands"): "the commands call render, not the other way",
}


def _top(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported(path: Path) -> set[tuple[str, ...]]:
    """What `path` imports from ddpdoctor, anywhere in it, as dotted paths below the package: a module, or
    a name in one (`from .rank import intercept` is `guard.rank.intercept`)."""
    folder = list(path.relative_to(PACKAGE).parts[:-1])
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {tuple(a.name.split(".")[1:]) for a in node.names if a.name.startswith("ddpdoctor.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "ddpdoctor":
                    continue
                parts = parts[1:]
            else:
                if node.level - 1 > len(folder):
                    continue
                parts = folder[: len(folder) - (node.level - 1)] + (node.module or "").split(".")
                parts = [p for p in parts if p]
            found |= {(*parts, a.name) for a in node.names}
    return found


def _imported_tops(path: Path) -> set[str]:
    """The top-level packages of ddpdoctor that `path` imports, anywhere in it."""
    return {parts[0] for parts in _imported(path)}


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "examples" in path.relative_to(PACKAGE).parts:  # the demo's example scripts, not the package
            continue
        top = _top(path)
        graph.setdefault(top, set()).update(t for t in _imported_tops(path) if t != top)
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def cyclic_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import a -> b such that b leads back to a."""
    return {(a, b) for a, targets in graph.items() for b in targets if _reaches(graph, b, a)}


def test_no_new_import_cycle_between_top_level_packages() -> None:
    cyclic = cyclic_imports(import_graph())
    new = sorted(cyclic - KNOWN_CYCLIC)
    assert not new, f"new import cycle(s) between top-level packages: {new}; see docs/architecture.md"
    broken = sorted(KNOWN_CYCLIC - cyclic)
    assert not broken, f"no longer on a cycle, remove from KNOWN_CYCLIC: {broken}"


def test_no_folder_imports_what_the_map_rules_out() -> None:
    found = []
    for (source, target), why in FORBIDDEN.items():
        for path in (PACKAGE / source).rglob("*.py"):
            found += [
                f"{path.relative_to(PACKAGE)} imports {'.'.join(parts)} ({why})"
                for parts in _imported(path)
                if parts[: len(target.split("/"))] == tuple(target.split("/"))
            ]
    assert not found, "\n".join(sorted(found))


def test_the_cycle_finder_sees_a_cycle_through_three_packages() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cyclic_imports(graph) == {("a", "b"), ("b", "c"), ("c", "a")}


def test_every_module_is_on_the_map() -> None:
    """docs/architecture.md names each module (its file name), or the folder that holds one per item."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    one_per_item = ("check/rules/",)  # one module per rule, named by its code
    missing = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "examples" not in path.relative_to(PACKAGE).parts
        and path.name not in text
        and not str(path.relative_to(PACKAGE)).startswith(one_per_item)
    )
    assert not missing, f"modules docs/architecture.md does not name: {missing}"
