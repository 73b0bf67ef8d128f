"""The rule registry: every rule is a small class, its documentation is its docstring.

A rule's docstring is its page, in ruff's format (`## What it does`, `## Why is this bad?`, `## Example`,
`## Use instead`, `## Fix safety`, `## References`), shown by `ddpdoctor rules DDPxxx` and rendered into
docs/rules/. Rules register themselves by decorating the class with `@register`; the modules in
`ddpdoctor.check.rules` are imported by `all_rules()`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import ClassVar

from ..findings import Severity


class Rule:
    code: ClassVar[str]  # DDPnnn
    name: ClassVar[str]  # kebab-case, e.g. "rank-conditional-collective"
    class_slug: ClassVar[str]  # the failure class in the catalogue
    severity: ClassVar[Severity] = Severity.ERROR
    summary: ClassVar[str]  # one line, shown in `ddpdoctor rules` and next to findings

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")


RULES: dict[str, type[Rule]] = {}


def register(rule: type[Rule]) -> type[Rule]:
    if rule.code in RULES and RULES[rule.code] is not rule:
        raise ValueError(f"rule code {rule.code} registered twice")
    RULES[rule.code] = rule
    return rule


def all_rules() -> dict[str, type[Rule]]:
    """Every rule, keyed by code, in code order."""
    from . import rules as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    return dict(sorted(RULES.items()))
