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
