"""The rule registry: every rule is a small class, its documentation is its docstring.

A rule's docstring is its page, in ruff's format (`## What it does`, `## Why is this bad?`, `## Example`,
`## Use instead`, `## Fix safety`, `## References`), shown by `ddpdoctor rules DDPxxx` and rendered into
docs/rules/. Rules register themselves by decorating the class with `@register`; the modules in
`ddpdoctor.check.rules` are imported by `all_rules()`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..findings import Finding, Fix, Location, Severity

if TYPE_CHECKING:
    from .source import SourceFile


class Rule:
    code: ClassVar[str]  # DDPnnn
    name: ClassVar[str]  # kebab-case, e.g. "rank-conditional-collective"
    class_slug: ClassVar[str]  # the failure class in the catalogue
    severity: ClassVar[Severity] = Severity.ERROR
    summary: ClassVar[str]  # one line, shown in `ddpdoctor rules` and next to findings
    # The checker's pre-filter: the rule runs only on files whose text contains one of these strings.
    # Empty means always. Keep them necessary conditions for a finding, never a guess.
    triggers: ClassVar[tuple[str, ...]] = ()
    # The rule asks whether the program is distributed (`program.distributed_program`): a file that shows
    # no marker itself is checked again when another file of its program does.
    asks_program: ClassVar[bool] = False

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def wanted(cls, text: str) -> bool:
        return not cls.triggers or any(t in text for t in cls.triggers)

    def check(self, source: SourceFile) -> Iterable[Finding]:
        """Every finding of this rule in one parsed file."""
        return ()

    def finding(self, source: SourceFile, node: ast.AST, message: str, *, fix: Fix | None = None,
                facts: Mapping[str, Any] | None = None) -> Finding:
        line, column, end_line, end_column = source.span(node)
        return Finding(
            class_=self.class_slug,
            code=self.code,
            severity=self.severity,
            message=message,
            locations=(Location(source.path, line, column, end_line, end_column),),
            fix=fix,
            facts=dict(facts or {}),
        )


RULES: dict[str, type[Rule]] = {}


def register(rule: type[Rule]) -> type[Rule]:
    if rule.code in RULES and RULES[rule.code] is not rule:
        raise ValueError(f"rule code {rule.code} registered twice")
    RULES[rule.code] = rule
    return rule


_CROSS_CHECKED = False


def all_rules() -> dict[str, type[Rule]]:
    """Every rule, keyed by code, in code order; checked once against the catalogue (a rule pointing to an
    unknown class, or one its class does not list, is a CatalogueError, not a silent gap in the docs)."""
    global _CROSS_CHECKED
    from . import rules as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    if not _CROSS_CHECKED:
        from ..catalogue import CATALOGUE

        CATALOGUE.check_rule_codes({code: rule.class_slug for code, rule in RULES.items()})
        _CROSS_CHECKED = True
    return dict(sorted(RULES.items()))
