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

from .source import SourceFile, call_name, keyword
from .values import scope_of_calls


class Shuffles(enum.Enum):
    YES = "yes"
    MAYBE = "maybe"
    NO = "no"


@dataclass(frozen=True)
class ShuffleAnswer:
    shuffles: Shuffles
    hedge: str = ""  # why it is only maybe, for the message


def is_distributed_sampler(call: ast.expr, source: SourceFile | None) -> bool:
    if not isinstance(call, ast.Call) or call_name(call) != "DistributedSampler":
        return False
    if source is None:
        return True
    qualname = source.resolve(call.func)
    # Unresolved (a star import, a local alias) is taken at its name; a resolved one must be torch's.
    return qualname is None or qualname.startswith("torch.utils.data")


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
