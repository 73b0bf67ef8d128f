"""The catalogue's own examples: each class's broken code is caught by one of its rules, its fixed code by
none of them. Checked through the command, on files written from the catalogue."""

from __future__ import annotations

import pytest

from ddpdoctor.catalogue import CATALOGUE

CLASSES = [c for c in CATALOGUE if c.rules and c.broken and c.fixed]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.slug)
def test_broken_example_is_caught_and_fixed_one_is_not(check, tmp_path, cls):
    broken = tmp_path / "broken.py"
    fixed = tmp_path / "fixed.py"
    broken.write_text(cls.broken, encoding="utf-8")
    fixed.write_text(cls.fixed, encoding="utf-8")
    select = ",".join(cls.rules)
    caught = check(str(broken), "--isolated", "--select", select, "--format", "json")
    assert caught.code == 1
    assert {f["class"] for f in caught.findings} == {cls.slug}
    clean = check(str(fixed), "--isolated", "--select", select, "--format", "json")
    assert clean.findings == [], clean.findings
