"""What a package's `__init__.py` binds its names to, for `from package import name`.

`from megatron.core import mpu`, where the `__init__` does `from megatron.core import parallel_state` and
then `mpu = parallel_state` (Megatron's legacy alias), is the module `parallel_state`, not a member of the
package. `from distributed import launch`, where the folder holds `launch.py` and the `__init__` does `from
.launch import launch`, is the function: Python binds the submodule first and the `__init__` then rebinds
the name. Only the `__init__`'s top-level imports and plain `name = other` aliases are read.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .index import ProjectFiles


def bound_names(files: ProjectFiles, package: str, tree: ast.Module | None) -> dict[str, str | None]:
    """Each name the `__init__` binds by import or alias: the project module it is, or None for anything
    else it imports (a function or class re-exported from a submodule, a library's name)."""
    bound: dict[str, str | None] = {}
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = files.module(alias.name, package)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            for alias in node.names:
                if alias.name != "*":
                    bound[alias.asname or alias.name] = files.module(
                        f"{base}.{alias.name}" if base else alias.name, package, node.level)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in bound:
            bound.update((t.id, bound[node.value.id]) for t in node.targets if isinstance(t, ast.Name))
    return bound
