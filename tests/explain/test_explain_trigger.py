"""The fast candidate-line search: literal anchors, and the same matches as the patterns themselves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.explain.knowledge import knowledge_base
from ddpdoctor.explain.trigger import Trigger, anchors

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (
            "No backend type associated with device type (?P<d>\\w+)",
            ["No backend type associated with device type "],
        ),
        ("Received data size doesn\\x27t match", ["Received data size doesn't match"]),
        ("Please call `iter\\(combined_loader\\)` first", ["Please call `iter(combined_loader)` first"]),
        ("rank:? (?P<r>\\d+)", ["rank"]),
        ("exitcode\\s*:", ["exitcode"]),
        ("LR finder|Learning rate set to \\d", ["LR finder", "Learning rate set to "]),
        ("Connection (?:closed|reset) by peer", ["Connection "]),
        ("Timed out|\\w+ closed", None),
        ("(?i:swissarmytransformer)", None),
        ("ab+c", None),
    ],
)
def test_anchors(pattern: str, expected: list[str] | None) -> None:
    assert anchors(pattern) == expected


def test_trigger_finds_what_the_patterns_find() -> None:
    kb = knowledge_base()
    patterns = [s.pattern for s in kb.signatures]
    trigger = Trigger(patterns)
    for path in sorted(FIXTURES.glob("*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        direct = sorted({m.start() for p in patterns for m in p.finditer(text)})
        assert sorted({m.start() for m in trigger.finditer(text)}) == direct, path.name


def test_trigger_refuses_an_unanchored_pattern() -> None:
    with pytest.raises(ValueError, match="literal characters"):
        Trigger([re.compile("\\d+ ranks")])
