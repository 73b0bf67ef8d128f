"""The one place the guard swallows an exception it cannot handle.

The guard must never break the program it watches, so some failures are dropped: a store gone at exit,
a group that cannot say its name, a report that cannot be shared. Each such place says where it is;
with `DDPDOCTOR_DEBUG=1` the swallowed exception is printed with its place and traceback, so a failure
that vanished (a final chain check at exit, say) can still be found.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TypeVar

from .config import debug_enabled

T = TypeVar("T")


def swallowed(where: str, exc: BaseException) -> None:
    """Note an exception the guard drops at `where`: silent, unless DDPDOCTOR_DEBUG is set."""
    if not debug_enabled():
        return
    try:
        print(f"[ddpdoctor] debug: {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
    except (OSError, ValueError):  # stderr closed at exit
        pass


@contextlib.contextmanager
def failsafe(where: str) -> Iterator[None]:
    """Run a block whose failure must not reach the program: it is dropped and noted (see `swallowed`)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the guard's one catch-all; each use names its place
        swallowed(where, exc)


def attempt(where: str, call: Callable[[], T], default: T) -> T:
    """`call()`, or `default` if it raises (noted as `failsafe` does)."""
    with failsafe(where):
        return call()
    return default
