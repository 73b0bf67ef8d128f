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
        lines += ["", "## Static rules", ""] + [
            f"- `{code}` (`ddpdoctor rules {code}`)" for code in cls.rules
        ]
    lines += ["", "## References", ""] + [f"- <{ref}>" for ref in cls.references]
    return "\n".join(lines) + "\n"


# Symptoms are either messages as printed (shown as code) or observations in prose (shown as text).
_PROSE_OPENINGS = ("The ", "No error", "With ", "Several ", "After ", "All ", "A ", "An ", "os.makedirs")


def _looks_like_message(text: str) -> bool:
    return not text.startswith(_PROSE_OPENINGS)


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


def generated_docs() -> dict[str, str]:
    """Relative path under docs/ -> content, for every class and rule page plus the two indexes."""
    from ..check.registry import all_rules

    rules = all_rules()
    files: dict[str, str] = {}
    index = ["# Failure classes", "", "Generated from `src/ddpdoctor/catalogue/data/` by "
             "`python -m ddpdoctor.catalogue.pages docs`; edit the data files, not these pages.", "",
             "| id | class | title | rules |", "|---|---|---|---|"]
    for cls in CATALOGUE:
        name = f"{cls.id}-{cls.slug}.md"
        files[f"classes/{name}"] = class_page(cls)
        codes = ", ".join(f"[{c}](../rules/{c}.md)" for c in cls.rules) or "—"
        index.append(f"| {cls.id} | [`{cls.slug}`]({name}) | {cls.title} | {codes} |")
    files["classes/README.md"] = "\n".join(index) + "\n"
    rule_index = ["# Rules of `ddpdoctor check`", "", "Generated from the rule classes in "
                  "`src/ddpdoctor/check/rules/` by `python -m ddpdoctor.catalogue.pages docs`.", "",
                  "| code | name | class | summary |", "|---|---|---|---|"]
    for code, rule in rules.items():
        files[f"rules/{code}.md"] = rule_page(code)
        owner = CATALOGUE.get(rule.class_slug)
        rule_index.append(f"| [{code}]({code}.md) | `{rule.name}` | [`{owner.slug}`](../classes/{owner.id}-"
                          f"{owner.slug}.md) | {rule.summary} |")
    files["rules/README.md"] = "\n".join(rule_index) + "\n"
    return files


if __name__ == "__main__":  # python -m ddpdoctor.catalogue.pages DOCS_DIR
    import sys
    from pathlib import Path

    root = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    for relative, content in generated_docs().items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        print(target)
