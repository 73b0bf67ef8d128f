"""`ddpdoctor report DIR` in the terminal: the program's own text shown as it is, call sites whole."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.findings import Finding, Fix, Location, Severity, dumps

DEEP = "/home/ci/work/team-project/team-project/experiments/2026-11-24/sweep-17/checkout/train.py"


def write_run(directory: Path) -> Path:
    directory.mkdir()
    finding = Finding(
        class_="uneven-batches",
        severity=Severity.ERROR,
        message="rank 0 waits in all_reduce after metric [val/loss] at train.py:31",
        locations=(Location(DEEP, 31, rank=0),),
        fix=Fix(
            "wrap the training loop in `with Join([model]):` so ranks with fewer batches shadow the others"
        ),
    )
    (directory / "report.json").write_text(dumps([finding]))
    record = {
        "rank": 0,
        "index": 1,
        "group": "0",
        "seq": 0,
        "op": "all_reduce",
        "reduce_op": "SUM",
        "root": None,
        "shapes": [[4]],
        "dtypes": ["float32"],
        "devices": ["cpu"],
        "site": [DEEP, 31, "main", None],
        "library": None,
        "time": 0.0,
        "state": "in",
    }
    (directory / "rank-0.jsonl").write_text(json.dumps(record) + "\n")
    return directory


def test_text_from_the_program_is_not_read_as_rich_markup(tmp_path: Path, cli) -> None:
    result = cli("report", str(write_run(tmp_path / "run")))
    assert result.returncode == 1, result.stderr
    assert "with Join([model]):" in result.stdout  # was `with Join():`
    assert "metric [val/loss] at" in result.stdout


def test_a_deep_call_site_keeps_its_file_and_line_in_a_pipe_without_columns(tmp_path: Path, cli) -> None:
    result = cli("report", str(write_run(tmp_path / "run")), env={"COLUMNS": ""})
    assert result.returncode == 1, result.stderr
    assert "…" not in result.stdout.replace("…/", "")  # no cell cut with an ellipsis
    assert any("checkout/train.py:31" in line for line in result.stdout.splitlines())
    assert f"{DEEP}:31" in result.stdout  # the finding's location, whole
