"""Which files `ddpdoctor check PATH...` looks at.

Named files are always checked. Directories are walked for `*.py`/`*.pyi`, skipping version-control and
tool directories, build outputs (`build`, `dist`: not when the directory is a package, as
`mmengine/dist/` is), virtual environments (any directory holding a `pyvenv.cfg`) and `site-packages`; a
directory that is named on the command line is walked even if it is one of those (ruff's behaviour).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

SKIPPED_DIRS = frozenset({
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints", ".mypy_cache", ".nox",
    ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".svn", ".tox", ".venv", ".vscode",
    "__pycache__", "__pypackages__", "_build", "buck-out", "build", "dist", "node_modules", "site-packages",
    "dist-packages", "venv",
})
SOURCE_SUFFIXES = (".py", ".pyi")
# Build outputs by name, unless the directory is a Python package (`mmengine/dist/__init__.py`: the
# package's distributed helpers, source code; `dist/` of setuptools holds archives, `build/` copies).
OUTPUT_DIRS = frozenset({"build", "dist", "_build", "buck-out"})


def discover(paths: list[str], excluded: Callable[[str], bool]) -> Iterator[str]:
    """Yield the files to check, each once, in a stable order. Missing named paths are yielded as they
    are, so that the engine reports them like any unreadable file."""
    seen: set[str] = set()
    for root in paths:
        if os.path.isdir(root):
            for path in walk(root, excluded):
                key = os.path.realpath(path)
                if key not in seen:
                    seen.add(key)
                    yield os.path.normpath(path)  # `train.py`, not `./train.py`
        else:
            key = os.path.realpath(root)
            if key not in seen:
                seen.add(key)
                yield root


def walk(root: str, excluded: Callable[[str], bool]) -> Iterator[str]:
    """The source files under `root`, skipping the directories `discover` skips."""
    for directory, dirnames, filenames in os.walk(root, onerror=None):
        keep = []
        for name in sorted(dirnames):
            full = os.path.join(directory, name)
            if name in SKIPPED_DIRS and not (name in OUTPUT_DIRS and os.path.isfile(
                    os.path.join(full, "__init__.py"))) or os.path.isfile(
                    os.path.join(full, "pyvenv.cfg")) or excluded(full):
                continue
            keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES):
                full = os.path.join(directory, name)
                if not excluded(full):
                    yield full
