"""The objects of project classes a function names: `distr = DistribTorch.instance()`, `t = Trainer(cfg)`.

A name bound once in its function to a constructor or a classmethod factory of the project holds an object
of that class (`Target(path, "Class")`, or `Target(path, "Class.factory()")` for the index to resolve), so
`distr.barrier()` and `distr.is_global_main` name the class's method and property.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .facts import Target
from .rank_paths import enclosing_function
from .source import statements

if TYPE_CHECKING:
    from .index import Resolver
    from .source import SourceFile


def objects_at(source: SourceFile, resolver: Resolver, node: ast.AST) -> dict[str, Target]:
    """The names of project objects in the function whose lines hold `node` (memoised per function)."""
    func = enclosing_function(source, node)
    if func is None:
        return {}
    cache: dict[int, dict[str, Target]] = source.__dict__.setdefault("_local_objects", {})
    if id(func) in cache:
        return cache[id(func)]
    bound: dict[str, list[ast.expr | None]] = {}
    for stmt in statements(func.body):  # an assignment is a statement: no expression is walked
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(stmt.value)
                    continue
                for part in ast.walk(target):
                    if isinstance(part, ast.Name):
                        bound.setdefault(part.id, []).append(stmt.value if part is target else None)
    found: dict[str, Target] = {}
    for name, values in bound.items():
        value = values[0] if len(values) == 1 else None
        made = resolver.class_of(value) if value is not None else None
        if made is not None and made.name[:1].isupper():
            found[name] = Target(made.path, f"{made.name}()") if "." in made.name else made
    cache[id(func)] = found
    return found
