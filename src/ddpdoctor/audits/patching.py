"""Replacing one attribute (a function, a method, a module global) with a wrapper, and putting it back.

The runtime audits patch entry points that run once per save or per wrap; each patch is undone with the
guard, and only if nobody replaced the attribute again in between (then the later patch keeps it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Uninstall = Callable[[], None]


def patch(owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> Uninstall:
    """Set `owner.name` to `make_wrapper(original)`; return the function that restores the original. An
    owner without the attribute is left alone (the library version does not have that entry point)."""
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if original is None:
        return _nothing
    wrapper = make_wrapper(original)
    setattr(owner, name, wrapper)

    def restore() -> None:
        current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if current is wrapper:
            setattr(owner, name, original)

    return restore


def all_of(removers: list[Uninstall]) -> Uninstall:
    def remove() -> None:
        while removers:
            removers.pop()()

    return remove


def _nothing() -> None:
    return None
