"""Where a checkpoint write goes: a path every rank shares, a path of its own rank, or memory.

One answer for DDP601 and for the summaries that follow a save across files: what writes a checkpoint
(`checkpoint_write`: torch's, TorchScript's, safetensors' and transformers' writers), and where. A save
into memory (`io.BytesIO()`, directly or through a name every binding of which is one, as in "save,
seek(0), load" to copy a state dict) or to a path that mentions the rank is no race; a path is recognised
by its shape (a string, an f-string, `os.path.join`, a name like `path`, `ckpt`, `out`, or a name bound to
one of those).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .source import SourceFile, dotted, statements, walk
from .values import Bound, scope_of_calls

PATHLIKE_WORDS = ("path", "file", "ckpt", "checkpoint", "dir", "out", "name")
# The text a file needs to hold to write anything `checkpoint_write` knows (a cheap filter before the walk).
WRITE_WORDS = ("save", "copyfile", "copytree", "copy2", "shutil.copy", "import copy", "'w'", '"w"', "rename",
               "replace", "move", "mkdir", "makedirs")
BUFFER_CLASSES = ("BytesIO", "StringIO")


def looks_like_path(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.JoinedStr, ast.BinOp)):
        return True
    if isinstance(node, ast.Call):  # (`"{}/epoch_{}.pt".format(...)`: a method of a literal, no dotted name)
        func = node.func
        last = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        # (`last.replace("last.ckpt", "prev.ckpt")`, `p.with_suffix(".bak")`: a path made from a path)
        return last in ("join", "Path", "format", "str") or last in DERIVED_PATHS and isinstance(
            func, ast.Attribute) and looks_like_path(func.value)
    name = (dotted(node) or "").rsplit(".", 1)[-1].lower()
    return any(word in name for word in PATHLIKE_WORDS)


# Functions that write a checkpoint to the file they are given: (argument index, keyword) of the file.
FILE_WRITERS = {
    "torch.save": (1, "f"),
    "torch.jit.save": (1, "f"),
    "safetensors.torch.save_file": (1, "filename"),
    "safetensors.torch.save_model": (1, "filename"),
    # a checkpoint copied to a second name (`best.pt`) is written there again by every process that copies
    "shutil.copyfile": (1, "dst"),
    "shutil.copy": (1, "dst"),
    "shutil.copy2": (1, "dst"),
    # a whole directory (a run's checkpoints, its config): every process copying it writes every file again
    "shutil.copytree": (1, "dst"),
}
DERIVED_PATHS = ("replace", "with_suffix", "with_name")
# Moves of a checkpoint: every process that runs one moves the same source, and all but the first find
# it gone (FileNotFoundError) or move a half-written one. (argument index, keyword) of the source: a source
# of the process's own (a rank or a `mkstemp()` name in it) moved onto a shared name is the atomic-write
# idiom.
FILE_MOVERS = {"os.rename": (0, "src"), "os.replace": (0, "src"), "shutil.move": (0, "src")}
# Directory creation that fails when the directory exists (no `exist_ok=True`): after an existence test,
# every process that passed the test before another created it raises FileExistsError.
DIRECTORY_MAKERS = {"os.makedirs": (0, "name"), "os.mkdir": (0, "path")}


@dataclass(frozen=True)
class Race:
    """What several processes running one writer on one path do: the act, its consequence, and the fix
    particular to it (None: the rule's one-writer fix)."""

    act: str  # "writes a checkpoint to", for "this call, which writes a checkpoint to a path shared by ..."
    consequence: str
    fix: str | None = None


def race(writer: str) -> Race:
    """The race of `writer` (a qualname, or "" where a chain's save does not say): a folder made after a
    check fails on all but the first process; anything else is several processes writing one file."""
    if writer in DIRECTORY_MAKERS:
        return Race("makes a folder at", "every process may find the folder missing and create it; all but "
                    "the first then fail with FileExistsError",
                    f"pass `exist_ok=True` to `{writer}`, or make the folder on one rank only")
    return Race("writes a checkpoint to", "several processes write the same file at once")


# The attribute a call of any of them ends with (`torch.save`, `model.save_pretrained`, `scripted.save`).
_WRITER_ATTRIBUTES = frozenset(
    {*(name.rsplit(".", 1)[1] for name in (*FILE_WRITERS, *FILE_MOVERS, *DIRECTORY_MAKERS)), "save",
     "save_pretrained", "open"})
# What makes a TorchScript module, whose `.save(path)` writes a file (`torch.jit.script(model).save(p)`).
SCRIPTED_BY = ("torch.jit.script", "torch.jit.trace", "torch.jit.freeze")


def checkpoint_write(source: SourceFile, call: ast.Call) -> tuple[str, ast.expr | None] | None:
    """`(what writes, where)` for a call that writes a checkpoint file on every process that runs it:
    `torch.save`, `torch.jit.save`, safetensors' `save_file`/`save_model`, `shutil.copyfile`/`copy`/`copy2`
    to a checkpoint's name (`.pt`, `.pth`, `.ckpt`, `.bin`, `.safetensors`, `.tar`), `shutil.copytree` (a
    whole directory, its checkpoints with it), a TorchScript module's
    `.save(path)`, transformers' `save_pretrained` without `is_main_process=`; None for any other call.
    `where` is None when the call names no file the checker can read."""
    if isinstance(call.func, ast.Attribute) and call.func.attr not in _WRITER_ATTRIBUTES:
        return None  # most calls of a file: no name to resolve
    if isinstance(call.func, ast.Name) and call.func.id == "open" or isinstance(
            call.func, ast.Attribute) and call.func.attr == "open":
        return _opened_for_writing(source, call)
    qualname = source.resolve(call.func)
    if qualname in FILE_WRITERS:
        where = _argument(call, *FILE_WRITERS[qualname])
        if qualname.startswith("shutil.copy") and qualname != "shutil.copytree" and not _checkpoint_named(
                source, where):
            return None  # a copy of any other file (a debug dump, a cache entry) is not a checkpoint's
        return qualname, where
    if qualname in FILE_MOVERS:  # (a checkpoint's, as for copies: a manifest's atomic flip is its writer's)
        where = _argument(call, *FILE_MOVERS[qualname])
        named = _checkpoint_named(source, where) or _in_checkpoint_folder(source, where)
        return (qualname, where) if named else None
    if qualname in DIRECTORY_MAKERS:
        return _racing_makedirs(source, call, qualname)
    if not isinstance(call.func, ast.Attribute):
        return None
    if call.func.attr == "save_pretrained":
        receiver = call.func.value
        if isinstance(receiver, ast.Name) and receiver.id == "self" and _defines_save_pretrained(source):
            return None  # the project's own method (a trainer's): judged by its body, as any project call
        where = _pretrained_destination(call)
        return (source.segment(call.func), where) if where is not None else None
    if call.func.attr == "save" and _scripted(source, call.func.value):
        return source.segment(call.func), _argument(call, 0, "f")
    return None


def _defines_save_pretrained(source: SourceFile) -> bool:
    """Whether a class of the file defines its own `save_pretrained` (asked once per file: a trainer may
    call `self.save_pretrained` many times)."""
    found = source.__dict__.get("_defines_save_pretrained")
    if found is None:
        found = source.__dict__["_defines_save_pretrained"] = any(
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "save_pretrained"
            for cls in source.classes.values() for node in cls.body)
    return found


def _racing_makedirs(source: SourceFile, call: ast.Call, qualname: str) -> tuple[str, ast.expr | None] | None:
    """`os.makedirs(d)` without `exist_ok=True` in the body of an `if` that tests whether a path exists
    (`if not os.path.exists(d): os.makedirs(d)`): check, then create, not atomic; not inside a `try` (whose
    handler may take the FileExistsError)."""
    exist_ok = keyword_value(call, "exist_ok")
    if exist_ok is not None and not (isinstance(exist_ok, ast.Constant) and not exist_ok.value) or len(
            call.args) > 2:
        return None  # (`exist_ok=flag`: the caller chose)
    branches = source.__dict__.get("_ifs_and_trys")
    if branches is None:  # (listed once per file: a file may make many folders)
        branches = source.__dict__["_ifs_and_trys"] = [
            node for node in walk(source.tree) if isinstance(node, (ast.If, ast.Try))]
    inside = [node for node in branches if node.lineno < call.lineno <= (node.end_lineno or node.lineno)]
    if any(isinstance(node, ast.Try) for node in inside):
        return None
    tested = any(isinstance(node, ast.If) and node.body and node.body[0].lineno <= call.lineno <= (
        node.body[-1].end_lineno or node.lineno) and any(word in source.segment(node.test) for word in (
            "exists", "isdir")) for node in inside)
    return (qualname, _argument(call, *DIRECTORY_MAKERS[qualname])) if tested else None


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".tar")
# a run's configuration written into its checkpoint folder (`train_params.yaml`, `config.json`): part of the
# checkpoint, what a converter or the next run reads back, the same file for every process that writes it
CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
CHECKPOINT_WORDS = ("checkpoint", "ckpt")


def _opened_for_writing(source: SourceFile, call: ast.Call) -> tuple[str, ast.expr | None] | None:
    """`open(path, "w")` (the builtin, a path's or a file-system object's; text, truncating, not appending) of
    a checkpoint's name, or of a configuration's in a checkpoint folder: every process that runs it rewrites
    the same file. (A settings dump in the working or log directory, `open("opt_config.json", "w")`, is no
    checkpoint's.)"""
    where, mode = _opened(call)
    if isinstance(call.func, ast.Name) and source.resolve(call.func) is not None or not (
            isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "w" in mode.value
            and "b" not in mode.value) or (  # (`open(p, "wb")` for `torch.save(x, f)`: the save is the write)
            not _checkpoint_named(source, where) and not (
                _checkpoint_named(source, where, CONFIG_SUFFIXES) and _in_checkpoint_folder(source, where))):
        return None
    opener = "open" if isinstance(call.func, ast.Name) else source.segment(call.func)
    return f'{opener}(…, "{mode.value}")', where


def _checkpoint_named(source: SourceFile, where: ast.expr | None,
                      suffixes: tuple[str, ...] = CHECKPOINT_SUFFIXES) -> bool:
    """The destination's text, or that of the bindings of the name it is, holds a checkpoint file name
    (`"best.pt"`, `exp_dir / "best-valid-loss.pt"`, `f"{out}/model.safetensors"`)."""
    if where is None:
        return False
    parts = [where]
    if isinstance(where, ast.Name):
        parts += [b.value for b in _bindings(source, where) if b.value is not None]
    return any(isinstance(node, ast.Constant) and isinstance(node.value, str)
               and node.value.endswith(suffixes)
               for part in parts for node in ast.walk(part))


def _in_checkpoint_folder(source: SourceFile, where: ast.expr | None, hops: int = 3) -> bool:
    """The path's text, or that of the bindings it is built from (three names deep), names a checkpoint
    folder (`os.path.join(save_dir, ...)` with `save_dir = cfg.checkpoint_root + ...`)."""
    if where is None:
        return False
    for node in ast.walk(where):
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else (
            dotted(node) or "" if isinstance(node, (ast.Name, ast.Attribute)) else "")
        if any(word in text.lower() for word in CHECKPOINT_WORDS):
            return True
        if hops and isinstance(node, ast.Name) and any(
                _in_checkpoint_folder(source, b.value, hops - 1) for b in _bindings(source, node)):
            return True
    return False


def keyword_value(call: ast.Call, name: str) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def _argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    """The argument at `index`, else the one passed as `keyword=`."""
    if len(call.args) > index:
        return call.args[index]
    return next((kw.value for kw in call.keywords if kw.arg == keyword), None)


def _bindings(source: SourceFile, name: ast.Name) -> frozenset[Bound]:
    """The bindings of `name` that reach the point where it is read."""
    return scope_of_calls(source)(name).at(name).get(name.id, frozenset())


def _scripted(source: SourceFile, receiver: ast.expr) -> bool:
    """A TorchScript module: made by `torch.jit.script`/`trace` right there, or a name every binding of which
    reaching the call is one."""
    if isinstance(receiver, ast.Call):
        return (source.resolve(receiver.func) or "").startswith(SCRIPTED_BY)
    if not isinstance(receiver, ast.Name):
        return False
    bindings = _bindings(source, receiver)
    return bool(bindings) and all(b.value is not None and _scripted(source, b.value) for b in bindings)


def _pretrained_destination(call: ast.Call) -> ast.expr | None:
    """Where `x.save_pretrained(directory)` writes on every process that calls it. transformers'
    `PreTrainedModel.save_pretrained` writes unless given `is_main_process=False` (the default is True; its
    documentation asks distributed callers to pass it), and a tokenizer's writes unconditionally. With the
    argument given, the caller chose the writer: no answer."""
    if any(kw.arg == "is_main_process" for kw in call.keywords):
        return None
    return _argument(call, 0, "save_directory")


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
    bound = _bindings(source, node)
    return bool(bound) and all(_makes_buffer(b.value) for b in bound)


def destination(source: SourceFile, call: ast.Call, where: ast.expr) -> ast.expr:
    """Where a save given `where` writes: the path of a file opened for it (`with open(path, "wb") as f:
    torch.save(obj, f)`), else `where` itself."""
    if isinstance(where, ast.Name):
        return opened_path(source, call, where) or where
    return where


def shared_destination(source: SourceFile, node: ast.expr) -> bool:
    """The place a save writes to is a path all ranks share: path-shaped, no rank in it, not memory."""
    return ((looks_like_path(node) or _bound_to_a_path(source, node))
            and "rank" not in source.segment(node).lower() and not is_buffer(source, node))


def opened_path(source: SourceFile, call: ast.Call, handle: ast.Name) -> ast.expr | None:
    """The path of the file `handle` names where `call` reads it, when a `with` around the call opened it for
    writing (`open(path, "wb")`, `Path(path).open("wb")`, `path.open(mode="wb")`)."""
    for node in statements(source.tree.body):  # outer `with`s first, as a walk would meet them
        if not isinstance(node, (ast.With, ast.AsyncWith)) or not (
                node.lineno <= call.lineno <= (node.end_lineno or node.lineno)):
            continue
        for item in node.items:
            target, opened = item.optional_vars, item.context_expr
            if not (isinstance(target, ast.Name) and target.id == handle.id and isinstance(opened, ast.Call)):
                continue
            path, mode = _opened(opened)
            if path is not None and isinstance(mode, ast.Constant) and isinstance(mode.value, str) and (
                    set(mode.value) & set("wax")):
                return path
    return None


def _opened(call: ast.Call) -> tuple[ast.expr | None, ast.expr | None]:
    """(path, mode) of a call that opens a file: the builtin `open(path, mode)`, a path's own
    `Path(p).open(mode)`, and a file-system object's `open(path, mode)` (iopath's and fvcore's `PathManager`,
    `fsspec`, `smart_open`, `tarfile`: the path first, as the builtin takes it). (None, None) otherwise."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        return _argument(call, 0, "file"), _argument(call, 1, "mode")
    if not (isinstance(func, ast.Attribute) and func.attr == "open"):
        return None, None
    first = call.args[0] if call.args else None
    if first is None or isinstance(first, ast.Constant) and isinstance(first.value, str) and set(
            first.value) <= _MODE_LETTERS:
        return func.value, _argument(call, 0, "mode")  # `path.open("w")`: the receiver is the file
    return first, _argument(call, 1, "mode")


_MODE_LETTERS = set("rwaxbt+")


def _bound_to_a_path(source: SourceFile, node: ast.expr) -> bool:
    """A name, whatever it is called, bound to a path where the save reads it (`save_to =
    os.path.join(...)`): the binding's shape, not the name's words, says it is a path."""
    if not isinstance(node, ast.Name):
        return False
    return any(b.value is not None and not isinstance(b.value, ast.Name) and looks_like_path(b.value)
               for b in _bindings(source, node))
