"""The markdown page of a rule (its class's line, then its docstring), and docs/'s generated pages: every
class page (`catalogue/pages.py`), every rule page and the two indexes. Here, not in `catalogue`, so that
the catalogue does not depend on the checker that checks itself against it."""

from __future__ import annotations

from ..catalogue import CATALOGUE
from ..catalogue.pages import class_page
from .registry import all_rules


def rule_page(code: str) -> str:
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
    rules = all_rules()
    files: dict[str, str] = {}
    index = ["# Failure classes", "", "Generated from `src/ddpdoctor/catalogue/data/` by "
             "`python -m ddpdoctor.check.pages docs`; edit the data files, not these pages.", "",
             "| id | class | title | rules |", "|---|---|---|---|"]
    for cls in CATALOGUE:
        name = f"{cls.id}-{cls.slug}.md"
        files[f"classes/{name}"] = class_page(cls)
        codes = ", ".join(f"[{c}](../rules/{c}.md)" for c in cls.rules) or "—"
        index.append(f"| {cls.id} | [`{cls.slug}`]({name}) | {cls.title} | {codes} |")
    files["classes/README.md"] = "\n".join(index) + "\n"
    rule_index = ["# Rules of `ddpdoctor check`", "", "Generated from the rule classes in "
                  "`src/ddpdoctor/check/rules/` by `python -m ddpdoctor.check.pages docs`.", "",
                  "| code | name | class | summary |", "|---|---|---|---|"]
    for code, rule in rules.items():
        files[f"rules/{code}.md"] = rule_page(code)
        owner = CATALOGUE.get(rule.class_slug)
        rule_index.append(f"| [{code}]({code}.md) | `{rule.name}` | [`{owner.slug}`](../classes/{owner.id}-"
                          f"{owner.slug}.md) | {rule.summary} |")
    files["rules/README.md"] = "\n".join(rule_index) + "\n"
    return files


if __name__ == "__main__":  # python -m ddpdoctor.check.pages DOCS_DIR
    import sys
    from pathlib import Path

    root = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    for relative, content in generated_docs().items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        print(target)
