"""Which ranks found each finding: a rank keeps its own findings (an audit's, F1's) in
`findings-rank-<r>-<pid>.json`, and the job's report lists a finding that several ranks made once (as
`report.collect_findings` keeps it), with the ranks that made it in `facts["found_by_ranks"]`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import replace

from ...findings import Finding, loads
from ..protocol import RunDir

_RANK_FILE = re.compile(r"findings-rank-(\d+)-\d+\.json$")  # rank, pid


def finding_key(finding: Finding) -> tuple[str, str]:
    """The identity of a finding across ranks: the one `report.collect_findings` deduplicates by."""
    return finding.class_, finding.message.split(";")[0]


def ranks_by_finding(run_dir: str) -> dict[tuple[str, str], list[int]]:
    """For each finding a rank left in its file, the ranks that left it (a file named by a pid, from a
    process that never knew its rank, counts for none)."""
    found: dict[tuple[str, str], set[int]] = {}
    for path in RunDir(run_dir).finding_files():
        named = _RANK_FILE.search(os.path.basename(path))
        if named is None:
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                items = loads(handle.read())
        except (OSError, ValueError):
            continue
        for finding in items:
            found.setdefault(finding_key(finding), set()).add(int(named.group(1)))
    return {key: sorted(ranks) for key, ranks in found.items()}


def with_ranks(findings: Sequence[Finding], run_dir: str) -> list[Finding]:
    """`findings` with `found_by_ranks` added to each one that ranks left in their files."""
    by_key = ranks_by_finding(run_dir)
    out = []
    for finding in findings:
        ranks = by_key.get(finding_key(finding))
        if ranks and "found_by_ranks" not in finding.facts:
            finding = replace(finding, facts={**finding.facts, "found_by_ranks": ranks})
        out.append(finding)
    return out
