"""Flags the project declares and never raises: `self.stop_training = False` in a class's method, and no
other binding of that attribute anywhere in the project.

A rank branch that leaves early only when such a flag holds (`if rank == 0: ... if callbacks.stop_training:
return`) never leaves: the flag is an extension point nobody used. Taking that `return` for a real exit turns
every later collective into a false DDP101. The flag is only trusted when the project owns it: it is first
bound on `self` in a class with no library base (a library base class may raise its own attribute), to a
falsy literal, in a class that does not set its own attributes by computed name (`setattr(self, k, v)`,
`self.__dict__.update(kwargs)`), and no file binds that attribute name, on any object, to anything else or
through `setattr(obj, "name", v)`. Limit: a computed `setattr` on another object is not taken to raise it.
A name nobody declares is unknown, never false.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FlagBindings:
    """One file's bindings of attributes to flag values: `lowered` declares a project flag, `raised` names an
    attribute bound to anything else."""

    lowered: frozenset[str] = frozenset()
    raised: frozenset[str] = frozenset()


def flag_bindings(tree: ast.Module, assigns: Iterable[ast.Assign | ast.AnnAssign | ast.AugAssign],
                  calls: Iterable[ast.Call]) -> FlagBindings:
    """From the file's assignments and calls (collected by the index's one walk over the file)."""
    lowered: set[str] = set()
    raised: set[str] = set()
    # Methods of the file's own classes (no base, or `object`): where a project flag is declared, unless
    # the class also sets attributes by computed name on itself (`setattr(self, k, v)` from its kwargs).
    own = [(node.lineno, node.end_lineno or node.lineno) for node in tree.body
           if isinstance(node, ast.ClassDef)
           and all(isinstance(base, ast.Name) and base.id == "object" for base in node.bases)]
    calls = list(calls)
    for call in calls:
        raised.update(_named_writes(call))
    spoiled = {call.lineno for call in calls if _computed_self_writes(call)}
    own = [(start, end) for start, end in own if not any(start < line <= end for line in spoiled)]
    for node in assigns:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for attribute in _attribute_targets(target):
                falsy = not isinstance(node, ast.AugAssign) and target is attribute and _falsy(node.value)
                if not falsy:
                    raised.add(attribute.attr)
                elif _on_self(attribute) and any(start < node.lineno <= end for start, end in own):
                    lowered.add(attribute.attr)
    return FlagBindings(frozenset(lowered), frozenset(raised))


def never_raised(files: Iterable[FlagBindings]) -> frozenset[str]:
    """The flags some file declares and no file raises."""
    lowered: set[str] = set()
    raised: set[str] = set()
    for bindings in files:
        lowered |= bindings.lowered
        raised |= bindings.raised
    return frozenset(lowered - raised)


def never_true(test: ast.expr, flags: frozenset[str]) -> bool:
    """`obj.flag`, `obj.flag and ...`, `obj.flag is True`: a test that cannot hold while `flag` is never
    raised."""
    if isinstance(test, ast.Attribute):
        return test.attr in flags
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(never_true(value, flags) for value in test.values)
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.Eq))
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is True):
        return never_true(test.left, flags)
    return False


def _attribute_targets(target: ast.expr) -> Iterable[ast.Attribute]:
    if isinstance(target, ast.Attribute):
        yield target
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _attribute_targets(element.value if isinstance(element, ast.Starred) else element)


def _on_self(attribute: ast.Attribute) -> bool:
    return _is_self(attribute.value)


def _falsy(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Constant) and value.value in (False, None)  # (0 == False: 0 too)


def _named_writes(call: ast.Call) -> Iterable[str]:
    """`setattr(obj, "flag", v)` with `v` not a falsy literal raises `flag`."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "setattr" and len(call.args) >= 2:
        name = call.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and not (
                len(call.args) > 2 and _falsy(call.args[2])):
            yield name.value


def _computed_self_writes(call: ast.Call) -> bool:
    """`setattr(self, name, v)` with a computed name, `self.__dict__.update(...)`, `vars(self).update(...)`:
    the class's own attributes may take any value its callers pass."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "setattr" and len(call.args) >= 2:
        return _is_self(call.args[0]) and not isinstance(call.args[1], ast.Constant)
    if isinstance(func, ast.Attribute) and func.attr == "update":
        owner = func.value
        if isinstance(owner, ast.Attribute) and owner.attr == "__dict__":
            return _is_self(owner.value)
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "vars":
            return bool(owner.args) and _is_self(owner.args[0])
    return False


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"
