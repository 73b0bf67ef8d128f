"""Markdown pages for failure classes and rules: the same text for `ddpdoctor rules` and docs/."""

from __future__ import annotations

from . import CATALOGUE, FailureClass


def class_page(cls: FailureClass) -> str:
    lines = [f"# {cls.id} `{cls.slug}` — {cls.title}", "", cls.summary, ""]
    lines += ["## Seen as", ""] + [f"- `{s}`" if _looks_like_message(s) else f"- {s}" for s in cls.symptoms]
    if cls.reported_in:
        lines += ["", "## Reported in", ""] + [f"- {r}" for r in cls.reported_in]
    lines += ["", "## Why", "", cls.why, "", "## Fixes", ""] + [f"- {f}" for f in cls.fixes]
    if cls.broken:
        lines += ["", "## Example", "", "```python", cls.broken, "```"]
    if cls.fixed:
        lines += ["", "## Use instead", "", "```python", cls.fixed, "```"]
    if cls.rules:
        lines += ["", "## Static rules", ""] + [f"- `{code}` (`ddpdoctor rules {code}`)" for code in cls.rules]
    lines += ["", "## References", ""] + [f"- <{ref}>" for ref in cls.references]
    return "\n".join(lines) + "\n"


def _looks_like_message(text: str) -> bool:
    return "Error" in text or "`" not in text and text[:1].isupper() and ":" in text


def rule_page(code: str) -> str:
    from ..check.registry import all_rules

    rule = all_rules()[code]
    owner = CATALOGUE.get(rule.class_slug)
    head = [
        f"# {rule.code} `{rule.name}`",
        "",
        f"Failure class: {owner.id} `{owner.slug}` — {owner.title} (`ddpdoctor rules {owner.id}`).  ",
        f"Severity: {rule.severity.value}.",
        "",
    ]
    return "\n".join(head) + rule.doc() + "\n"
