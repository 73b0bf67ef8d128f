"""Where a `torch.save` writes: a path every rank shares, a path of its own rank, or memory.

One answer for DDP601 and for the summaries that follow a save across files: a save into memory
(`io.BytesIO()`, directly or through a name every binding of which is one, as in "save, seek(0), load" to
copy a state dict) or to a path that mentions the rank is no race; a path is recognised by its shape (a
string, an f-string, `os.path.join`, a name like `path`, `ckpt`, `out`).
"""

from __future__ import annotations

import ast

from .source import SourceFile, dotted
from .values import scope_of_calls

PATHLIKE_WORDS = ("path", "file", "ckpt", "checkpoint", "dir", "out", "name")
BUFFER_CLASSES = ("BytesIO", "StringIO")


def looks_like_path(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.JoinedStr, ast.BinOp)):
        return True
    if isinstance(node, ast.Call):
        return (dotted(node.func) or "").rsplit(".", 1)[-1] in ("join", "Path", "format", "str")
    name = (dotted(node) or "").rsplit(".", 1)[-1].lower()
    return any(word in name for word in PATHLIKE_WORDS)


def save_destination(call: ast.Call) -> ast.expr | None:
    """Where `torch.save(obj, f)` writes: its second argument or `f=`."""
    if len(call.args) >= 2:
        return call.args[1]
    return next((kw.value for kw in call.keywords if kw.arg == "f"), None)


def pretrained_destination(call: ast.Call) -> ast.expr | None:
    """Where `x.save_pretrained(directory)` writes on every process that calls it. transformers'
    `PreTrainedModel.save_pretrained` writes unless given `is_main_process=False` (the default is True; its
    documentation asks distributed callers to pass it), and a tokenizer's writes unconditionally. With the
    argument given, the caller chose the writer: no answer."""
    if not isinstance(call.func, ast.Attribute) or call.func.attr != "save_pretrained":
        return None
    if any(kw.arg == "is_main_process" for kw in call.keywords):
        return None
    return call.args[0] if call.args else next(
        (kw.value for kw in call.keywords if kw.arg == "save_directory"), None)


def _makes_buffer(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Call) and (dotted(node.func) or "").rsplit(".", 1)[-1] in BUFFER_CLASSES


def is_buffer(source: SourceFile, node: ast.expr) -> bool:
    """`torch.save(obj, io.BytesIO())`, or into a name whose every binding reaching the save is one (or a
    name such as `buffer`): memory, not a shared file."""
    if _makes_buffer(node) or "BytesIO" in source.segment(node):
        return True
    if not isinstance(node, ast.Name):
        return False
    if "buf" in node.id.lower():
        return True
    bound = scope_of_calls(source)(node).at(node).get(node.id)
    return bool(bound) and all(_makes_buffer(b.value) for b in bound)


def shared_destination(source: SourceFile, node: ast.expr) -> bool:
    """The place a save writes to is a path all ranks share: path-shaped, no rank in it, not memory."""
    return (looks_like_path(node) and "rank" not in source.segment(node).lower()
            and not is_buffer(source, node))
