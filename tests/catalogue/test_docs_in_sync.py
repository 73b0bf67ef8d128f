"""docs/classes and docs/rules are generated from the catalogue and the rule docstrings: a stale page is a
documentation bug a user would read. Regenerate with `python -m ddpdoctor.check.pages docs`."""

from pathlib import Path

from ddpdoctor.check.pages import generated_docs

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_generated_pages_are_committed_and_current():
    stale = [
        relative for relative, content in generated_docs().items()
        if not (DOCS / relative).is_file() or (DOCS / relative).read_text(encoding="utf-8") != content
    ]
    assert not stale, f"regenerate with `python -m ddpdoctor.check.pages docs`: {stale}"
