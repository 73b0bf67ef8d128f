"""The guard's panels (`render/guard_text.py`): a finding whose `ranks` fact is not the guard's table of rank
states (an audit names its ranks as a list) prints as a panel, not as an internal error."""

from __future__ import annotations

import io

from ddpdoctor.findings import Finding, Location, Severity
from ddpdoctor.guard.report import render


def test_an_audit_finding_with_a_list_of_ranks_prints() -> None:
    finding = Finding(
        class_="checkpoint-race",
        severity=Severity.ERROR,
        message="ranks 0 and 1 wrote /ckpt/model.pt [x]",
        locations=(Location(path="/work/train.py", line=12, rank=0),),
        facts={"ranks": [0, 1]},
    )
    out = io.StringIO()
    render([finding], stream=out)
    text = out.getvalue()
    assert "checkpoint-race" in text
    assert "/ckpt/model.pt [x]" in text  # user text escaped, not read as rich markup


def test_a_thousand_ranks_in_the_same_place_share_one_row_and_the_outlier_comes_first(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # a wide log (the policy's default for a file), whatever ran before
    barrier = ["/work/train.py", 10, "finish", None]
    ranks = {
        str(r): {"state": f"in barrier (collective #7 of group 0), waiting {1.0 + r % 3:.1f} s",
                 "where": "train.py:10", "stack": [barrier]}
        for r in range(1, 1000)
    }
    ranks["0"] = {"state": "running, not in a collective (at train.py:42 in evaluate)", "where": None,
                  "stack": [["/work/train.py", 42, "evaluate", None]]}
    finding = Finding(class_="collective-timeout", severity=Severity.ERROR,
                      message="rank 1 has waited 3 s in barrier at train.py:10", facts={"ranks": ranks})
    out = io.StringIO()
    render([finding], stream=out)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert len(lines) <= 25, "\n".join(lines)
    rows = [line for line in lines if "train.py:" in line and "│" in line]
    outlier = next(i for i, line in enumerate(lines) if "running, not in a collective" in line)
    group = next(i for i, line in enumerate(lines) if "1–999 (999)" in line)
    assert outlier < group, rows
    assert "waiting 1.0–3.0 s" in lines[group]
