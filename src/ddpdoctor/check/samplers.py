"""Does a `DistributedSampler(...)` shuffle? Asked of the value-flow core, hedged where it cannot tell.

`shuffle` left out is torch's default, True. A literal answers itself. Any other value is followed through
its bindings and parameters (`values.py`): `shuffle=shuffle` in a builder whose callers pass `True`
shuffles; a value that is False on every path does not; a value read from configuration
(`opt["dataloader_shuffle"]`) is unknown, and an unknown `shuffle` is taken to shuffle, with the hedge
said in the finding ("if `shuffle` is true, as it is by default").
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass

from .source import SourceFile, call_name, keyword, statements
from .values import scope_of_calls

MAX_ALIAS_HOPS = 6


class Shuffles(enum.Enum):
    YES = "yes"
    MAYBE = "maybe"
    NO = "no"


@dataclass(frozen=True)
class ShuffleAnswer:
    shuffles: Shuffles
    hedge: str = ""  # why it is only maybe, for the message


def is_distributed_sampler(call: ast.expr, source: SourceFile | None) -> bool:
    """`DistributedSampler(...)`, by its qualified name through the imports (`as DS` too), or a call
    through a name bound to classes one of which is it (`S = RandomSampler if c else DistributedSampler;
    S(ds)`, `S = functools.partial(DistributedSampler, ...)`): a call of each, joined."""
    if not isinstance(call, ast.Call):
        return False
    if call_name(call) == "DistributedSampler":
        qualname = source.resolve(call.func) if source is not None else None
        # Unresolved (a star import) is taken at its name; a resolved one must be torch's.
        return qualname is None or qualname.startswith("torch.utils.data")
    if source is None:
        return False
    if (source.resolve(call.func) or "").startswith("torch.utils.data") and (
            source.resolve(call.func) or "").endswith(".DistributedSampler"):
        return True  # `from torch.utils.data import DistributedSampler as DS`
    return isinstance(call.func, ast.Name) and call.func.id in _sampler_aliases(source) and any(
        _is_torch_sampler(name, source) for name in bound_callables(call.func, source))


def _sampler_aliases(source: SourceFile) -> frozenset[str]:
    """The names a file binds to an expression that mentions DistributedSampler, or another such name
    (the cheap pre-filter of `bound_callables`, made once per file)."""
    found = getattr(source, "_sampler_aliases", None)
    if found is not None:
        return found
    assigns = [(n.targets[0].id, source.segment(n.value)) for n in statements(source.tree.body)
               if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
               and isinstance(n.value, (ast.Name, ast.Attribute, ast.IfExp, ast.Call))] if (
        "DistributedSampler" in source.text) else []
    names: set[str] = set()
    words = {"DistributedSampler"}
    for _ in range(MAX_ALIAS_HOPS):
        new = {name for name, text in assigns if name not in names and any(w in text for w in words)}
        if not new:
            break
        names |= new
        words |= new
    found = frozenset(names)
    source._sampler_aliases = found  # type: ignore[attr-defined]
    return found


def _is_torch_sampler(node: ast.expr, source: SourceFile) -> bool:
    if (node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")) != "DistributedSampler":
        return False
    qualname = source.resolve(node)
    return qualname is None or qualname.startswith("torch.utils.data")


def bound_callables(name: ast.Name, source: SourceFile, depth: int = 0) -> list[ast.expr]:
    """The classes or functions a name called as a function may be bound to where it is called: through
    assignments (every binding that reaches the call), conditional expressions (only the side a
    distributed run takes, where the test says), `functools.partial(f, ...)` and further names."""
    values = scope_of_calls(source)(name)
    found: list[ast.expr] = []
    pending: list[tuple[ast.expr, int]] = [(b.value, depth) for b in values.at(name).get(name.id, ())
                                           if b.value is not None]
    while pending:
        value, hops = pending.pop()
        if hops > MAX_ALIAS_HOPS:
            continue
        if isinstance(value, ast.IfExp):
            side = values.distributed_side(value.test)
            pending += [(v, hops + 1) for v, taken in ((value.body, "body"), (value.orelse, "orelse"))
                        if side in ("", taken)]
        elif isinstance(value, ast.Call) and call_name(value) == "partial" and value.args:
            pending.append((value.args[0], hops + 1))
        elif isinstance(value, ast.Name) and value.id != name.id:
            inner = values.at(value).get(value.id)
            if inner:
                pending += [(b.value, hops + 1) for b in inner if b.value is not None]
            else:
                found.append(value)  # an import or a global: the class itself
        elif isinstance(value, ast.Attribute):
            found.append(value)
    return found


def sampler_shuffles(call: ast.Call, source: SourceFile | None) -> ShuffleAnswer:
    shuffle = keyword(call, "shuffle")
    if shuffle is None:
        return ShuffleAnswer(Shuffles.YES)
    value = shuffle.value
    if isinstance(value, ast.Constant):
        return ShuffleAnswer(Shuffles.YES if value.value else Shuffles.NO)
    if source is None:
        return ShuffleAnswer(Shuffles.MAYBE, f"if `{ast.unparse(value)}` is true")
    held = scope_of_calls(source)(call).constants(value, call)
    if any(bool(v) for v in held.values):
        return ShuffleAnswer(Shuffles.YES)
    if held.unknown:
        shown = source.segment(value)
        why = "" if shown in held.unknown else f": {held.unknown}"
        return ShuffleAnswer(Shuffles.MAYBE, f"if `{shown}` is true (the checker cannot read it{why}; "
                                             "DistributedSampler's default is True)")
    return ShuffleAnswer(Shuffles.NO)
