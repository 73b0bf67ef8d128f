"""The project's own modules that the files named on the command line import.

`ddpdoctor check train.py` must see what `train.py` calls: a `dist.barrier()` in `utils.py` next to it
decides whether `train.py`'s rank branch hangs. The checker reads those modules for the project index and
reports only in the files it was asked about. A module counts when it lies under the named file's project
root, the nearest folder above it holding `pyproject.toml`, `setup.py`, `setup.cfg` or `.git` (else the
file's own folder); imports are followed transitively, breadth first, up to `MAX_MODULES` modules.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from .discovery import SOURCE_SUFFIXES, walk
from .project import ProjectFiles

ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# A script that imports half of a monorepo still gets a bounded run; a root without markers (a script in
# a crowded folder) is not walked without end.
MAX_MODULES = 2000
MAX_CANDIDATES = 100_000


@dataclass(frozen=True)
class LocalImports:
    """The modules read besides the named files, and the project roots they were looked for under."""

    modules: tuple[str, ...]
    roots: tuple[str, ...]


def project_root(path: str) -> str:
    """The nearest folder at or above the file's that marks a project, else the file's folder."""
    start = os.path.dirname(os.path.abspath(path))
    folder = start
    while True:
        if any(os.path.exists(os.path.join(folder, marker)) for marker in ROOT_MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return start
        folder = parent


def local_imports(named: Iterable[str], excluded: Callable[[str], bool]) -> LocalImports:
    """The project modules the named files import, directly or through each other (not the named files)."""
    named = [path for path in named if path.endswith(SOURCE_SUFFIXES) and os.path.isfile(path)]
    if not named:
        return LocalImports((), ())
    roots = tuple(dict.fromkeys(project_root(path) for path in named))
    candidates = list(islice((path for root in roots for path in walk(root, excluded)), MAX_CANDIDATES))
    files = ProjectFiles([*named, *candidates])
    asked = {os.path.realpath(path) for path in named}
    seen = set(asked)
    queue = list(named)
    found: list[str] = []
    while queue and len(found) < MAX_MODULES:
        current = queue.pop(0)
        for module in _imported(current, files):
            key = os.path.realpath(module)
            if key in seen:
                continue
            seen.add(key)
            found.append(module)
            queue.append(module)
            if len(found) >= MAX_MODULES:
                break
    return LocalImports(tuple(found), roots)


def _imported(path: str, files: ProjectFiles) -> Iterator[str]:
    """The files of this run that `path`'s imports name, anywhere in the file (imports inside functions
    too); a file that cannot be read or parsed imports nothing here (the engine reports it)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found = files.module(alias.name, path)
                if found:
                    yield found
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found = files.module(base, path, node.level) if base or node.level else None
            if found:
                yield found
            for alias in node.names:  # `from pkg import helpers`: a submodule, when there is one
                name = f"{base}.{alias.name}" if base else alias.name
                sub = files.module(name, path, node.level)
                if sub:
                    yield sub
