"""The files of the run and the imports between them: which project file an import names (packages, `sys.path`
additions the source spells, star imports, a package's `__init__` names). Calls are resolved in index.py."""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterable, Iterator

from .import_paths import added_folders
from .package_names import bound_names
from .source import ImportTable, statements


class ProjectFiles:
    """The files of this run, for resolving imports to them: `import a.b` from `x/y/main.py` is
    `x/y/a/b.py`, `x/a/b.py`, ... (the script's directory, then its ancestors: packages and src layouts),
    or `a/b/__init__.py` at any of those places."""

    def __init__(self, paths: Iterable[str]):
        # Every dotted name a file could be imported as (`c`, `b.c`, `a.b.c` for a/b/c.py), with the
        # directory it is imported from: one dictionary look-up per import.
        paths = list(paths)
        self.by_name: dict[str, list[tuple[str, str]]] = {}
        for path in paths:
            full = os.path.abspath(path)
            parts = full.split(os.sep)
            last = parts[-1]
            if last in ("__init__.py", "__init__.pyi"):
                parts = parts[:-1]
            else:
                parts[-1] = last.removesuffix(".pyi").removesuffix(".py")
            for depth in range(1, min(len(parts), 12)):
                name = ".".join(parts[-depth:])
                root = os.sep.join(parts[:-depth]) or os.sep
                self.by_name.setdefault(name, []).append((root, path))
        self.by_path: dict[str, str] = {os.path.abspath(path): path for path in paths}
        self._cache: dict[tuple[str, str, int], str | None] = {}
        self._folders: dict[str, frozenset[str]] = {}
        self._added: dict[str, tuple[str, ...]] = {}
        self._tables: dict[str, tuple[dict[str, str], list[tuple[str, int]]] | None] = {}
        self._package_names: dict[str, dict[str, str | None]] = {}

    def module(self, dotted_name: str, from_path: str, level: int = 0) -> str | None:
        directory = os.path.dirname(from_path)
        key = (directory, dotted_name, level)
        if key in self._cache:
            return self._cache[key]
        found = self._find(dotted_name, from_path, level)
        if found is None and not level and dotted_name in self.by_name:
            found = self._through_sys_path(dotted_name, from_path)
        self._cache[key] = found
        return found

    def _through_sys_path(self, dotted_name: str, from_path: str) -> str | None:
        """An absolute import that resolves only through a folder the importer, or a project module it
        imports (`import _init_paths`), puts on `sys.path` (`import_paths.py`)."""
        if dotted_name.partition(".")[0] in sys.stdlib_module_names:
            return None
        folders = self.sys_path_folders(from_path)
        return next((path for root, path in self.by_name[dotted_name] if root in folders), None)

    def sys_path_folders(self, path: str) -> frozenset[str]:
        """The folders `path` and the project modules it imports add to `sys.path` (read once)."""
        path = os.path.abspath(path)
        known = self._folders.get(path)
        if known is None:
            tree = _parsed(path)
            folders: set[str] = set()
            if tree is not None:
                folders.update(self._own_folders(path, tree))
                for imported in _imported_names(tree):
                    found = self._find(imported, path, 0)
                    if found is not None and os.path.abspath(found) != path:
                        folders.update(self._own_folders(os.path.abspath(found)))
            known = self._folders[path] = frozenset(folders)
        return known

    def _own_folders(self, path: str, tree: ast.Module | None = None) -> tuple[str, ...]:
        """The folders one module adds itself (read once; a module that never names `sys.path` or
        `addsitedir` is not parsed)."""
        known = self._added.get(path)
        if known is None:
            if tree is None:
                try:
                    with open(path, encoding="utf-8", errors="replace") as handle:
                        text = handle.read()
                except OSError:
                    text = ""
                tree = _parsed_text(text, path) if "sys.path" in text or "addsitedir" in text else None
            known = self._added[path] = added_folders(tree, path) if tree is not None else ()
        return known

    def _find(self, dotted_name: str, from_path: str, level: int) -> str | None:
        base = os.path.dirname(os.path.abspath(from_path))
        if level:
            for _ in range(level - 1):
                base = os.path.dirname(base)
            if not dotted_name:  # `from . import x`: the package itself
                init = os.path.join(base, "__init__.py")
                return next((p for r, p in self.by_name.get(os.path.basename(base), ()) if
                             os.path.abspath(p) == init), None)
        candidates = self.by_name.get(dotted_name)
        if not candidates:
            return None
        best: tuple[int, str] | None = None
        for root, path in candidates:
            if level and root != base:
                continue
            # The script's directory or an ancestor; or, for a src layout, an ancestor's `src` folder
            # (`scripts/train.py` importing the package kept in `src/pkg/`).
            folder = os.path.basename(root)
            if folder == "lib" and dotted_name.partition(".")[0] in sys.stdlib_module_names:
                continue  # `import logging` is the standard library's, whatever `lib/` holds
            home = os.path.dirname(root) if not level and folder in SRC_FOLDERS else root
            if _within(base, root) or _within(base, home):
                if best is None or len(home) > best[0]:  # the nearest ancestor wins
                    best = (len(home), path)
        return best[1] if best else None


    def star_names(self, path: str, tree: ast.Module) -> dict[str, str]:
        """The imported names `from <project module> import *` brings into `path` (that module's own
        imports, and those its star imports bring, any depth): `from header import *` where `header`
        does `import torch` makes `torch.save` mean torch's."""
        found: dict[str, str] = {}
        seen = {os.path.abspath(path)}
        frontier = [(node.module or "", node.level, path) for node in tree.body
                    if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)]
        while frontier and len(seen) < MAX_STAR_MODULES:
            name, level, importer = frontier.pop(0)
            module = self.module(name, importer, level) if name or level else None
            if module is None or os.path.abspath(module) in seen:
                continue
            seen.add(os.path.abspath(module))
            imported = self._imports_of(module)
            if imported is None:
                continue
            table, stars = imported
            for local, qualified in table.items():
                found.setdefault(local, qualified)
            frontier.extend((star, star_level, module) for star, star_level in stars)
        return found

    def _imports_of(self, path: str) -> tuple[dict[str, str], list[tuple[str, int]]] | None:
        """A module's import table and its star imports (read once)."""
        key = os.path.abspath(path)
        if key not in self._tables:
            tree = _parsed(key)
            self._tables[key] = None if tree is None else (
                ImportTable.from_tree(tree).names,
                [(node.module or "", node.level) for node in tree.body if isinstance(node, ast.ImportFrom)
                 and any(a.name == "*" for a in node.names)])
        return self._tables[key]

    def package_names(self, package: str) -> dict[str, str | None]:
        """What a package's `__init__.py` binds its names to (package_names.py; read once)."""
        if package not in self._package_names:
            self._package_names[package] = bound_names(self, package, _parsed(package))
        return self._package_names[package]

    def submodule(self, package: str, parts: list[str]) -> str | None:
        """The project module `parts` names below a package's `__init__.py` (`utils.distributed` below
        `onmt/__init__.py` is `onmt/utils/distributed.py`, or that folder's `__init__.py`)."""
        if os.path.basename(package) not in ("__init__.py", "__init__.pyi") or not parts:
            return None
        folder = os.path.join(os.path.dirname(os.path.abspath(package)), *parts)
        for candidate in (folder + ".py", os.path.join(folder, "__init__.py"), folder + ".pyi"):
            found = self.by_path.get(candidate)
            if found is not None:
                return found
        return None

    def elsewhere(self, dotted_name: str) -> list[str]:
        """The project files an absolute import names from some other folder of the tree: where
        `module()` finds nothing, the script may reach them through a folder it adds to `sys.path` at run
        time (`import _init_paths` putting `../lib` first), which the checker does not evaluate."""
        return [path for _root, path in self.by_name.get(dotted_name, ())]


def _parsed(path: str) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return _parsed_text(handle.read(), path)
    except OSError:
        return None


def _parsed_text(text: str, path: str) -> ast.Module | None:
    try:
        return ast.parse(text, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _imported_names(tree: ast.Module) -> Iterator[str]:
    """The absolute module names a module's top-level statements import (where `sys.path` is set up)."""
    for node in statements(tree.body):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module


def _within(base: str, root: str) -> bool:
    return base == root or base.startswith(root.rstrip(os.sep) + os.sep)


SRC_FOLDERS = ("src", "lib")
MAX_STAR_MODULES = 32  # `from a import *` chains: a bounded walk
