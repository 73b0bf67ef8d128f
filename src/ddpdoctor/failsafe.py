"""The one place the guard and the runtime audits swallow an exception they cannot handle.

Both run inside the program they watch and must never break it, so some failures are dropped: a store
gone at exit, a group that cannot say its name, a report that cannot be shared, an audit's patch that does
not fit another library version. Each such place says where it is; with `DDPDOCTOR_DEBUG=1` the swallowed
exception is printed with its place and traceback, so a failure that vanished (a final chain check at
exit, say) can still be found. Neither the guard's nor the audits' own (both use it): no ddpdoctor import.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

ENV_DEBUG = "DDPDOCTOR_DEBUG"  # say why a swallowed exception was swallowed


def debug_enabled() -> bool:
    return os.environ.get(ENV_DEBUG, "") not in ("", "0")


def swallowed(where: str, exc: BaseException) -> None:
    """Note an exception dropped at `where`: silent, unless DDPDOCTOR_DEBUG is set."""
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
