"""Names resolved through the imports to the files of the run: which project file an import names, and
which project function a call names (`f()`, `mod.f()`, `self.m()`, `Class.m()`, a method of a local object,
a name from `from x import *`). Never by substring: what does not resolve is not a project function."""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from .facts import SUPER, Target
from .project_files import ProjectFiles
from .source import dotted

if TYPE_CHECKING:
    from .source import SourceFile


@dataclass(frozen=True)
class _Module:
    path: str


@dataclass(frozen=True)
class _Member:
    path: str
    name: str


_BUILTINS = frozenset(dir(builtins))


class Resolver:
    """Calls of one file to functions of the project: `f()`, `mod.f()`, `self.m()`, `Class.m()`, and a
    method of a local object made from a project class in the same function (`t = Trainer(); t.run()`)."""

    def __init__(self, source: SourceFile, files: ProjectFiles):
        self.path = source.path
        self._files = files
        self._tree = source.tree
        self._attributes: dict[tuple[str, str], Target] | None = None
        self.names: dict[str, _Module | _Member] = {}
        self.stars: list[str] = []  # project modules imported with `from x import *`
        # project files an import that does not resolve from here may name (`ProjectFiles.elsewhere`)
        self.unresolved: set[str] = set()
        self.local: set[str] = set()
        self.classes: dict[str, list[ast.expr]] = {}
        for node in source.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.local.add(node.name)
            elif isinstance(node, ast.ClassDef):
                self.local.add(node.name)
                self.classes[node.name] = node.bases
        # The one walk over the file's statements: imports here, loops and assignments for the summary.
        self.loops: list[ast.For | ast.AsyncFor] = []
        self.whiles: list[ast.While] = []
        self.ifs: list[ast.If] = []
        self.assigns: list[ast.Assign] = []
        self.other_assigns: list[ast.AnnAssign | ast.AugAssign] = []
        self.returns: list[ast.Return] = []
        for node in source.all_statements:
            cls = node.__class__
            if cls is ast.For or cls is ast.AsyncFor:
                self.loops.append(node)  # type: ignore[arg-type]
            elif cls is ast.While:
                self.whiles.append(node)  # type: ignore[arg-type]
            elif cls is ast.If:
                self.ifs.append(node)  # type: ignore[arg-type]
            elif cls is ast.Assign:
                self.assigns.append(node)  # type: ignore[arg-type]
            elif cls is ast.Return:
                self.returns.append(node)  # type: ignore[arg-type]
            elif cls is ast.AnnAssign or cls is ast.AugAssign:
                self.other_assigns.append(node)  # type: ignore[arg-type]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        found = files.module(alias.name, self.path)
                        if found:
                            self.names[alias.asname] = _Module(found)
                    else:
                        top = alias.name.split(".")[0]
                        found = files.module(top, self.path)
                        if found:
                            self.names[top] = _Module(found)
                    if files.module(alias.name, self.path) is None:
                        self.unresolved.update(files.elsewhere(alias.name))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                origin = files.module(base, self.path, node.level) if (base or node.level) else None
                for alias in node.names:
                    if alias.name == "*":
                        if origin is not None:
                            self.stars.append(origin)
                        continue
                    local = alias.asname or alias.name
                    sub = files.module(f"{base}.{alias.name}" if base else alias.name, self.path, node.level)
                    # what the package's `__init__` binds the name to wins (`mpu = parallel_state`, `from
                    # .launch import launch` over `launch.py`): "" where it binds nothing
                    bound = files.package_names(origin).get(alias.name, "") if origin is not None and (
                        origin.endswith("__init__.py")) else ""
                    if bound:
                        self.names[local] = _Module(bound)
                    elif sub is not None and bound == "":
                        self.names[local] = _Module(sub)
                    elif origin is not None:
                        self.names[local] = _Member(origin, alias.name)
                    elif not node.level and base:
                        self.unresolved.update(files.elsewhere(base))
                    self.local.discard(local)

    @cached_property
    def aliases(self) -> dict[str, ast.expr]:
        """Module-level names bound once to another callable: `run = train`, `run = functools.partial(
        train, cfg)`, `run = decorate(train)` is not one (what a decorator returns is not known)."""
        bound: dict[str, list[ast.expr]] = {}
        for stmt in self._tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
                    stmt.targets[0], ast.Name):
                value = stmt.value
                if isinstance(value, ast.Call) and (dotted(value.func) or "").rsplit(".", 1)[-1] == (
                        "partial") and value.args:
                    value = value.args[0]
                bound.setdefault(stmt.targets[0].id, []).append(value)
        return {name: values[0] for name, values in bound.items() if len(values) == 1 and isinstance(
            values[0], (ast.Name, ast.Attribute)) and name not in self.local and name not in self.names}

    def callee(self, func: ast.expr, cls: str | None, objects: dict[str, Target] | None = None
               ) -> tuple[Target, bool] | None:
        """The project function a call's callee names, and whether the call is bound (a method call)."""
        hops = 0
        while isinstance(func, ast.Name) and func.id in self.aliases and hops < 8:  # a cycle stops here
            func, hops = self.aliases[func.id], hops + 1
        if isinstance(func, ast.Name):
            if func.id in self.local:
                return Target(self.path, func.id), False
            ref = self.names.get(func.id)
            if isinstance(ref, _Member):
                return Target(ref.path, ref.name), False
            if ref is None and self.stars and func.id not in _BUILTINS:
                # Maybe from a star import: the index looks through them (`ProjectIndex._reexport`).
                return Target(self.path, func.id), False
            return None
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):
            return self._registry(func.value.id)  # `PIPELINES[kind](...)`: one of the classes it holds
        if not isinstance(func, ast.Attribute):
            return None
        owner = func.value
        if isinstance(owner, ast.Name):
            if owner.id in ("self", "cls") and cls is not None:
                return Target(self.path, f"{cls}.{func.attr}"), True
            if owner.id in self.local and owner.id in self.classes:
                return Target(self.path, f"{owner.id}.{func.attr}"), False
            ref = self.names.get(owner.id)
            if isinstance(ref, _Module):
                return Target(ref.path, func.attr), False
            if isinstance(ref, _Member):  # `from pkg import Class` then `Class.method(...)`
                return Target(ref.path, f"{ref.name}.{func.attr}"), False
            if objects and owner.id in objects:
                made = objects[owner.id]
                return Target(made.path, f"{made.name}.{func.attr}"), True
        elif isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and (
                owner.func.id == "super" and cls is not None):  # the first base of `cls` defining it
            return Target(self.path, f"{cls}.{SUPER}{func.attr}"), True
        elif isinstance(owner, ast.Call) and (new := self.class_of(owner)) is not None and (
                new.name[:1].isupper()):  # `Trainer(cfg).fit()`: as `t = Trainer(cfg); t.fit()`
            return Target(new.path, f"{new.name}.{func.attr}"), True
        elif isinstance(owner, ast.Attribute) and (module := self._package_path(owner)) is not None:
            return Target(module, func.attr), False  # `import pkg.utils` then `pkg.utils.dist.gather(...)`
        elif isinstance(owner, ast.Attribute) and cls is not None and isinstance(owner.value, ast.Name) and (
                owner.value.id == "self"):
            kept = self.attribute_class(cls, owner.attr)
            if kept is not None:  # `self.ckpt = Checkpointer(...)` in the class, then `self.ckpt.save()`
                return Target(kept.path, f"{kept.name}.{func.attr}"), True
        return None

    @cached_property
    def registries(self) -> dict[str, list[ast.expr]]:
        """Module-level dicts of classes by key (`PIPELINES = {"train": TrainingPipeline, ...}`): the
        values, each a name the file can resolve. `summarize` keeps each as `NAME[]`, a function calling
        every value, so `PIPELINES[kind](...)` in any file that imports it calls each of them."""
        found: dict[str, list[ast.expr]] = {}
        for stmt in self._tree.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else (
                stmt.target if isinstance(stmt, ast.AnnAssign) else None)
            value = getattr(stmt, "value", None)
            if isinstance(target, ast.Name) and isinstance(value, ast.Dict) and value.values and all(
                    (dotted(v) or ".").rsplit(".", 1)[-1][:1].isupper() for v in value.values):
                found[target.id] = list(value.values)  # classes only: a call through it constructs one
        return found

    def _registry(self, name: str) -> tuple[Target, bool] | None:
        ref = self.names.get(name)
        if isinstance(ref, _Member):
            return Target(ref.path, f"{ref.name}[]"), False
        return (Target(self.path, f"{name}[]"), False) if name in self.registries else None

    def _package_path(self, owner: ast.Attribute) -> str | None:
        """The project module a dotted path through a package names: `pkg.utils.dist` where `pkg` is an
        imported project package (`import pkg.utils`, `from pkg import utils` then `utils.dist`). Python
        reaches a submodule as an attribute of its package once any module has imported it."""
        name = dotted(owner)
        if name is None:
            return None
        root, *parts = name.split(".")
        ref = self.names.get(root)
        if not isinstance(ref, _Module):
            return None
        return self._files.submodule(ref.path, parts)

    def attribute_class(self, cls: str, attribute: str) -> Target | None:
        """The project class an attribute of `self` is made from in the class's methods (`self.x = C()`),
        when every such assignment makes the same one."""
        if self._attributes is None:
            made: dict[tuple[str, str], Target | None] = {}
            spans = [(node.lineno, node.end_lineno or node.lineno, node.name) for node in self._tree.body
                     if isinstance(node, ast.ClassDef)]
            for stmt in self.assigns:  # collected by the one walk over the file
                if not isinstance(stmt.value, ast.Call):
                    continue
                for target in stmt.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and (
                            target.value.id == "self"):
                        owner = next(
                            (name for first, last, name in spans if first <= stmt.lineno <= last), None
                        )
                        if owner is not None:
                            key = (owner, target.attr)
                            made_here = self.class_of(stmt.value)
                            if made_here is None or not made_here.name[:1].isupper():
                                made[key] = None
                            else:
                                made[key] = made_here if made.get(key, made_here) == made_here else None
            self._attributes = {key: target for key, target in made.items() if target is not None}
        return self._attributes.get((cls, attribute))

    def class_of(self, call: ast.expr) -> Target | None:
        """`Trainer(...)`: the project class a constructor call names."""
        if isinstance(call, ast.Call):
            found = self.callee(call.func, None)
            if found is not None:
                return found[0]
        return None

