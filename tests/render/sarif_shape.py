"""The structure every SARIF log ddpdoctor writes must have (SARIF 2.1.0, as GitHub code scanning reads
it)."""

from __future__ import annotations

import json
from typing import Any

LEVELS = {"error", "warning", "note"}


def sarif_results(text: str) -> list[dict[str, Any]]:
    """The results of a SARIF 2.1.0 log, after checking the shape of the log, its rules and its results."""
    log = json.loads(text)
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "ddpdoctor" and driver["version"]
    rule_ids = {rule["id"] for rule in driver["rules"]}
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"] and rule["help"]["text"]
    results = run["results"]
    for result in results:
        assert result["ruleId"] in rule_ids
        assert result["level"] in LEVELS
        assert result["message"]["text"]
        for location in result.get("locations", []):
            physical = location["physicalLocation"]
            assert physical["artifactLocation"]["uri"] and "\\" not in physical["artifactLocation"]["uri"]
            region = physical.get("region", {})
            assert all(isinstance(v, int) and v >= 1 for v in region.values()), region
    assert {r["ruleId"] for r in results} == rule_ids  # one descriptor per rule used, no more
    return results


def region(result: dict[str, Any], index: int = 0) -> tuple[str, int | None]:
    """(uri, startLine) of a result's location."""
    physical = result["locations"][index]["physicalLocation"]
    return physical["artifactLocation"]["uri"], physical.get("region", {}).get("startLine")
