"""Where a collective, a save or a wrap was issued from: the user's frame and the library frame that made
the call (the guard's and the audits' question, neither's own).

Frames are classified once per file name (a dict lookup on the hot path afterwards): *internal*
(torch.distributed's own wrappers and ddpdoctor), *library* (anything installed: site-packages,
dist-packages, the standard library; torch.nn.parallel included) or *user* (everything else).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from typing import Any

from .records import Frame

_INTERNAL = 0
_LIBRARY = 1
_USER = 2

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# ddpdoctor's own frames in a rank are never the user's line: the guard's, the audits', and those of the
# modules both of them call on the program's threads (this one, failsafe.py, advice.py)
_OWN_CODE = (
    os.path.join(_PACKAGE, "guard"),
    os.path.join(_PACKAGE, "audits"),
    *(os.path.join(_PACKAGE, name) for name in ("callsite.py", "failsafe.py", "advice.py")),
)
_STDLIB_DIRS = tuple(
    {
        os.path.realpath(p) + os.sep
        for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"))
        if p
    }
)
_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_MAX_DEPTH = 80


_kinds: dict[str, tuple[int, str | None]] = {}
COMPILED_GRAPH = "torch.compile"  # the library named for frames of a graph torch.compile/torch.fx generated


def classify(filename: str) -> tuple[int, str | None]:
    """(kind, library name) for a code object's file name; cached."""
    known = _kinds.get(filename)
    if known is not None:
        return known
    result: tuple[int, str | None]
    norm = filename.replace("/", os.sep)
    if norm.startswith(_OWN_CODE) or (
        "torch" + os.sep + "distributed" + os.sep in norm
        and os.path.basename(norm) in ("distributed_c10d.py", "c10d_logger.py")
    ):
        result = (_INTERNAL, None)
    elif filename.startswith("<eval_with_key>"):
        result = (_LIBRARY, COMPILED_GRAPH)  # code torch.fx generated: the user's line is the frame below
    elif filename.startswith("<"):
        # <frozen ...>, <string> (`python -c`, a spawned child's bootstrap, exec'd code), <stdin>: not
        # something a user can open, nor the line a report should name; a notebook cell's is the user's
        result = (_USER, None) if filename.startswith("<ipython-input") else (_LIBRARY, "python")
    else:
        result = (_USER, None)
        for marker in _MARKERS:
            at = norm.find(marker)
            if at >= 0:
                rest = norm[at + len(marker) :]
                name = rest.split(os.sep, 1)[0]
                if name.endswith(".py"):
                    name = name[:-3]
                result = (_LIBRARY, torch_part(rest) if name == "torch" else name)
                break
        else:
            real = os.path.realpath(norm) if os.path.isabs(norm) else norm
            if real.startswith(_STDLIB_DIRS):
                result = (_LIBRARY, "python")
    _kinds[filename] = result
    return result


def torch_part(path: str) -> str:
    """The library name of a frame in torch, from its path below site-packages: torch's distributed
    subsystems are named (`torch.distributed.fsdp` for FSDP's all-gathers, `torch.distributed.checkpoint`,
    `torch.nn.parallel`), so a report can say which of them issued a collective; any other torch frame (a
    decorator's wrapper, dynamo) is plain `torch`, which reports do not name as the issuer."""
    parts = path.split(os.sep)
    if len(parts) > 3 and parts[1] == "distributed":
        return "torch.distributed." + parts[2]
    if parts[1:3] == ["nn", "parallel"]:
        return "torch.nn.parallel"
    return "torch"


# One Frame object per (code, instruction offset): a loop issues its collectives from a few places, and a
# fingerprint's signature is interned on these frames (equal frames, and the same object most of the time).
# Keyed on `f_lasti`, a field, rather than `f_lineno`, which decodes the code's line table on every read;
# and on the code's id, not the code: hashing a code object hashes all its constants on every lookup (3.8 µs
# for a 300-line function on Python 3.11). The codes are kept alive beside the cache, so an id in it is
# never reused by another code object.
_frames: dict[tuple[int, int], Frame] = {}
_codes: list[Any] = []
# For the hot path's inlined first step (rank/calls.py): the caches' own lookups, and a user frame's kind.
known_kind = _kinds.get
known_frame = _frames.get
USER_KIND = _USER


def _frame(frame: Any, library: str | None) -> Frame:
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    found = _frames.get(key)
    if found is None:
        found = Frame(code.co_filename, frame.f_lineno, code.co_name, library)
        if len(_frames) >= 8192:
            _frames.clear()
            _codes.clear()
        _frames[key] = found
        _codes.append(code)
    return found


def call_sites(depth: int = 2) -> tuple[Frame | None, Frame | None]:
    """(user frame, issuing library frame) of the caller `depth` frames up; either may be None."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None, None
    library: Frame | None = None
    seen_library = False
    steps = 0
    # The two cache lookups are inlined: this runs on every guarded collective, and a Python call costs
    # about a microsecond when the caches are cold (right after a backward pass).
    while frame is not None and steps < _MAX_DEPTH:
        code = frame.f_code
        kind, lib = _kinds.get(code.co_filename) or classify(code.co_filename)
        if kind == _USER:
            return _frames.get((id(code), frame.f_lasti)) or _frame(frame, None), library
        if kind == _LIBRARY and not seen_library:
            seen_library = True
            library = _frames.get((id(code), frame.f_lasti)) or _frame(frame, lib)
        frame = frame.f_back  # type: ignore[assignment]
        steps += 1
    return None, library


def stack_of(frame, limit: int = 12) -> list[Frame]:  # type: ignore[no-untyped-def]
    """The innermost `limit` frames of a (possibly foreign thread's) stack, innermost first, as
    `select_stack` keeps them."""

    def walk():  # type: ignore[no-untyped-def]
        at, depth = frame, 0
        while at is not None and depth < _MAX_DEPTH:
            depth += 1
            yield at.f_code.co_filename, at.f_lineno, at.f_code.co_name
            at = at.f_back

    return select_stack(walk(), limit)


def select_stack(frames: Iterable[tuple[str, int, str]], limit: int = 12) -> list[Frame]:
    """Of (file, line, function) entries, innermost first: the innermost `limit`, the guard's own frames
    dropped; torch.distributed's wrappers are torch's (library) frames, not the user's. Where none of
    those frames is the user's (FSDP's or Lightning's deep stacks), the innermost user frame is added after
    them: it is the line a report names."""
    out: list[Frame] = []
    has_user = False
    for filename, line, function in frames:
        if len(out) >= limit and has_user:
            break
        if filename.startswith(_OWN_CODE):
            continue
        kind, lib = classify(filename)
        if kind == _USER:
            out.append(Frame(filename, line, function, None))
            has_user = True
        elif len(out) < limit:
            out.append(Frame(filename, line, function, lib or "torch"))
    return out


def is_user(path: str) -> bool:
    return classify(path)[0] == _USER
