"""The advice and references a runtime finding gives, from the catalogue: each class's `[guard.advice]`
table holds a `default` and the more precise advice a verdict can name (`Verdict.advice`: a peer that
passed the call in C++, how a dead rank died). The catalogue is the one place the words live; the guard's
verdicts and the runtime audits both ask here (neither's own)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .failsafe import failsafe


def advice(slug: str, key: str | None = None) -> str:
    """The class's advice for `key`, else its default; empty if the catalogue has none."""
    table = advice_table(slug)
    return table.get(key or "default") or table.get("default", "")


def advice_table(slug: str) -> Mapping[str, str]:
    found = _class(slug)
    guard = found.extra.get("guard") if found is not None else None
    table = guard.get("advice") if isinstance(guard, Mapping) else None
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, Mapping) else {}


def class_references(slug: str) -> tuple[str, ...]:
    """The catalogue's references for a class, for a finding; none if the catalogue cannot be read."""
    found = _class(slug)
    return tuple(found.references) if found is not None else ()


def _class(slug: str) -> Any:
    # imported here, under failsafe: a catalogue that does not load costs a finding its advice, not the
    # report (the catalogue validates itself at import)
    with failsafe("advice: the catalogue did not load (the report must not depend on it)"):
        from .catalogue import CATALOGUE

        return CATALOGUE.get(slug)
    return None
