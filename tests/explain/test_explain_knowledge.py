"""The knowledge base in the catalogue files: loads, and refuses malformed entries loudly."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ddpdoctor.catalogue import CATALOGUE
from ddpdoctor.explain.knowledge import KnowledgeError, knowledge_base, load_knowledge, parse_class_knowledge

RUNTIME_CLASSES = {
    "backend-device-mismatch",
    "init-module-scope",
    "foreign-device-hooks",
    "collective-divergence",
    "collective-timeout",
    "dead-rank",
    "unused-parameters",
    "process-group-missing",
    "checkpoint-race",
    "single-rank-long-section",
    "replica-divergence",
    "sharded-step-divergence",
}


def with_extra(**extra: Any):
    base = CATALOGUE.get("dead-rank")
    return dataclasses.replace(base, extra=extra, source="test.toml")


def signature(**overrides: Any) -> dict[str, Any]:
    entry = {"id": "x", "pattern": "boom (?P<n>\\d+)", "confidence": 0.5}
    entry.update(overrides)
    return entry


def test_packaged_knowledge_base_loads() -> None:
    kb = knowledge_base()
    with_signatures = {c.failure.slug for c in kb.classes if c.signatures}
    assert with_signatures == RUNTIME_CLASSES
    assert kb.trigger.search("RuntimeError: No backend type associated with device type cpu")
    assert not kb.trigger.search("Epoch 3: loss=0.25")


def test_a_valid_entry_parses() -> None:
    knowledge = parse_class_knowledge(
        with_extra(
            signatures=[signature(fix=["with {n}", "plain"], explain=[["a {n}", "a"], "b"], role="victim")],
            extractors=[{"pattern": "rank (?P<rank>\\d+)", "scope": "before"}],
            refinements=[{"id": "r", "when": "oom", "facts": {"k": 1}, "confidence": -0.2}],
        )
    )
    (sig,) = knowledge.signatures
    assert (
        sig.role == "victim" and sig.fix == ("with {n}", "plain") and sig.explain == (("a {n}", "a"), ("b",))
    )
    assert knowledge.refinements[0].facts == {"k": 1}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"signatures": {"id": "x"}}, "array of tables"),
        ({"signatures": [signature(pattern="broken (")]}, "not a valid regex"),
        ({"signatures": [signature(pattern="")]}, "non-empty regex"),
        ({"signatures": [signature(pattern="(?i:boom) \\d+")]}, "at least 4 literal characters"),
        ({"signatures": [signature(pattern="Timed out|\\w+ closed")]}, "at least 4 literal characters"),
        (
            {"refinements": [{"id": "r", "when": "[Pp]rocess", "scope": "log"}]},
            "at least 4 literal characters",
        ),
        ({"signatures": [signature(pattern="(?P<a>x)(?P=a)")]}, "back-references"),
        ({"signatures": [{"id": "x", "pattern": "boom"}]}, "`confidence` is required"),
        ({"signatures": [signature(confidence=1.5)]}, "between 0.0 and 1"),
        ({"signatures": [signature(confidence=True)]}, "between 0.0 and 1"),
        ({"signatures": [signature(role="bystander")]}, "`role` must be one of"),
        ({"signatures": [signature(id="")]}, "`id` must be"),
        ({"signatures": [signature(), signature()]}, "duplicate id"),
        ({"signatures": [signature(colour="red")]}, "unknown key(s) colour"),
        ({"signatures": [signature(final="yes")]}, "`final` must be true or false"),
        ({"signatures": [signature(fix="Rank {0}")]}, "not a plain fact name"),
        ({"signatures": [signature(fix="Rank {rank")]}, "not a valid template"),
        ({"signatures": [signature(explain=[1])]}, "string or a list of strings"),
        ({"extractors": [{"pattern": "x", "scope": "everywhere"}]}, "`scope` must be one of"),
        ({"extractors": [{"pattern": "no groups"}]}, "give `fact` or named groups"),
        ({"extractors": [{"fact": "Bad Name", "pattern": "x"}]}, "lower_case name"),
        ({"refinements": [{"id": "r", "when": "x", "scope": "nearby"}]}, "`scope` must be one of"),
        ({"refinements": [{"id": "r", "when": "x", "facts": {"k": [1]}}]}, "table of plain values"),
        ({"refinements": [{"id": "r", "when": "x", "confidence": -2}]}, "between -1.0 and 1"),
        ({"refinements": [{"when": "x"}]}, "`id` must be"),
    ],
)
def test_malformed_entries_raise_naming_the_file(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(KnowledgeError) as error:
        parse_class_knowledge(with_extra(**extra))
    assert message in str(error.value)
    assert str(error.value).startswith("test.toml")


def test_load_knowledge_rejects_a_bad_class_among_good_ones() -> None:
    classes = [*CATALOGUE, with_extra(signatures=[signature(pattern="[")])]
    with pytest.raises(KnowledgeError):
        load_knowledge(classes)


def test_a_new_pattern_is_a_data_change() -> None:
    # A class that gains a signature is found in a log without any code change.
    extra = dict(CATALOGUE.get("dead-rank").extra)
    extra["signatures"] = [
        *extra["signatures"],
        {
            "id": "oom-killer",
            "pattern": "Out of memory: Killed process (?P<pid>\\d+)",
            "confidence": 0.8,
            "fix": "Process {pid} ran out of host memory",
        },
    ]
    classes = [dataclasses.replace(c, extra=extra) if c.slug == "dead-rank" else c for c in CATALOGUE]
    kb = load_knowledge(classes)

    from ddpdoctor.explain.diagnose import Analysis
    from ddpdoctor.explain.scanner import scan

    analysis = Analysis(kb)
    for hit in scan(
        [("[12345.6] Out of memory: Killed process 4242 (python)\n", True)],
        analysis.trigger,
        "dmesg",
        analysis.stats,
    ):
        analysis.add(hit)
    (diagnosis,) = analysis.diagnoses()
    assert diagnosis.finding.class_ == "dead-rank"
    assert (
        diagnosis.finding.fix is not None
        and diagnosis.finding.fix.message == "Process 4242 ran out of host memory"
    )
