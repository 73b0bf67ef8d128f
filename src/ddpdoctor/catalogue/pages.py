"""The markdown page of a failure class: the same text for `ddpdoctor rules` and docs/ (the rule pages, and
the generation of docs/, are the checker's: `check/pages.py`)."""

from __future__ import annotations

from . import FailureClass


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
