"""SARIF 2.1.0, the format code-scanning services (GitHub code scanning, GitLab, IDEs) read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..findings import Finding, Severity
from .registry import write

if TYPE_CHECKING:
    from rich.console import Console

    from ..reports import Report

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _rule_descriptors(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    summaries: dict[str, str] = {}
    try:
        from ..check.registry import all_rules

        summaries = {code: rule.summary for code, rule in all_rules().items()}
    except ImportError:  # pragma: no cover
        pass
    # the guard's and explain's findings have no rule code: their rule is the failure class
    from ..catalogue import CATALOGUE

    summaries.update({f.class_: CATALOGUE.get(f.class_).title for f in findings
                      if not f.code and f.class_ in CATALOGUE})
    ids = sorted({f.code or f.class_ for f in findings})
    return [
        {
            "id": rule_id,
            "shortDescription": {"text": summaries.get(rule_id, rule_id)},
            "help": {"text": f"ddpdoctor rules {rule_id}"},
        }
        for rule_id in ids
    ]


def _result(finding: Finding) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.code or finding.class_,
        "level": _LEVEL[finding.severity],
        "message": {"text": finding.message},
        "properties": {"class": finding.class_},
    }
    locations = []
    for loc in finding.locations:
        region: dict[str, int] = {}
        for key, value in (("startLine", loc.line), ("startColumn", loc.column), ("endLine", loc.end_line),
                           ("endColumn", loc.end_column)):
            if value is not None:
                region[key] = value
        physical: dict[str, Any] = {"artifactLocation": {"uri": loc.path.replace("\\", "/")}}
        if region:
            physical["region"] = region
        locations.append({"physicalLocation": physical})
    if locations:
        result["locations"] = locations
    if finding.fix is not None:
        result["properties"]["fix"] = finding.fix.message
    if finding.confidence is not None:
        result["properties"]["confidence"] = finding.confidence
    # what the detector established (docs/json.md), for tools that read more than the message
    if finding.facts:
        result["properties"]["facts"] = dict(finding.facts)
    return result


def render_sarif(findings: Sequence[Finding]) -> str:
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "ddpdoctor",
                "version": __version__,
                "rules": _rule_descriptors(findings),
            }},
            "results": [_result(f) for f in findings],
        }],
    }
    return json.dumps(log, indent=2, ensure_ascii=False)


def print_sarif(report: Report, console: Console) -> None:
    write(console, render_sarif(report.findings))
