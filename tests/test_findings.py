import json

import pytest

from ddpdoctor.findings import (
    Applicability,
    Edit,
    Evidence,
    Finding,
    Fix,
    Location,
    Severity,
    dumps,
    loads,
)


def full_finding() -> Finding:
    return Finding(
        class_="collective-divergence",
        code="DDP101",
        severity=Severity.ERROR,
        message="`self.log(..., sync_dist=True)` runs only on rank 0",
        locations=(
            Location("model.py", 27, 13, 27, 55),
            Location("model.py", 25, 9, rank=0),
        ),
        fix=Fix(
            "log with rank_zero_only=True",
            edits=(Edit("model.py", 27, 40, 27, 54, "rank_zero_only=True"),),
            applicability=Applicability.SAFE,
        ),
        evidence=(Evidence("[rank0]: waiting in all_reduce", line=12, rank=0),),
        references=("https://lightning.ai/docs/pytorch/stable/extensions/logging.html",),
        facts={"metric": "val_metric", "ranks": [0, 1]},
        confidence=0.9,
    )


def test_json_round_trip_preserves_every_field():
    original = [full_finding(), Finding(class_="dead-rank", message="rank 1 died")]
    assert loads(dumps(original)) == original


def test_json_has_the_documented_flat_keys():
    data = json.loads(dumps([full_finding()]))[0]
    assert data["class"] == "collective-divergence"
    assert data["code"] == "DDP101"
    assert (data["path"], data["line"], data["column"], data["end_line"], data["end_column"]) == (
        "model.py", 27, 13, 27, 55)
    assert data["fix"]["applicability"] == "safe"
    assert data["locations"][1]["rank"] == 0
    assert data["evidence"][0] == {"text": "[rank0]: waiting in all_reduce", "line": 12, "rank": 0}


def test_fix_without_edits_has_no_applicability():
    data = json.loads(dumps([Finding(class_="dead-rank", message="m", fix=Fix("restart it"))]))[0]
    assert data["fix"] == {"message": "restart it", "applicability": None, "edits": []}
    assert (
        loads(dumps([Finding(class_="dead-rank", message="m", fix=Fix("restart it"))]))[0].fix.message
        == "restart it"
    )


@pytest.mark.parametrize(
    "bad",
    ['{"class": "x"}', '[{"message": "no class"}]', '[{"class": "x", "message": "m", "severity": "fatal"}]'],
)
def test_malformed_json_raises_value_error(bad):
    with pytest.raises(ValueError):
        loads(bad)


def test_location_str_names_rank_and_position():
    assert str(Location("train.py", 11, 5, rank=1)) == "[rank 1] train.py:11:5"
    assert str(Location("train.py")) == "train.py"


def test_severity_order():
    assert Severity.ERROR.rank > Severity.WARNING.rank > Severity.INFO.rank
