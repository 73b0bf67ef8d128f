"""`ddpdoctor report DIR` in the terminal: the program's own text shown as it is, call sites whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddpdoctor.findings import Evidence, Finding, Fix, Location, Severity, dumps

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


def write_recording(directory: Path, findings: list[Finding], records: dict[int, list[dict]]) -> Path:
    directory.mkdir()
    (directory / "report.json").write_text(dumps(findings))
    for rank, lines in records.items():
        (directory / f"rank-{rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return directory


def call(rank: int, site: list, library: list | None) -> dict:
    return {"rank": rank, "index": 0, "group": "0", "seq": 0, "op": "all_reduce", "reduce_op": "SUM",
            "root": None, "shapes": [[1]], "dtypes": ["float32"], "devices": ["cpu"], "site": site,
            "library": library, "time": 0.0, "state": "done"}


WARNING = Finding(class_="sampler-epoch", severity=Severity.WARNING, message="set_epoch is never called",
                  locations=(Location("train.py", 9),))


def test_a_rank_without_python_collectives_gets_one_line_why_not_an_empty_table(tmp_path: Path, cli) -> None:
    """A plain DDP run: its gradient all-reduces come from C++, and the rank files hold no call."""
    result = cli("report", str(write_recording(tmp_path / "run", [], {0: [], 1: []})))
    assert result.returncode == 0, result.stderr
    assert "collective(s)" not in result.stdout  # no "rank 0: last 0 collective(s)" table
    words = " ".join(result.stdout.split())
    for rank in (0, 1):
        assert f"rank {rank}: no collective called from Python was recorded. DDP's gradient all-reduces " \
            "are issued from C++" in words


def test_a_call_site_shows_the_library_frame_and_the_users_line(tmp_path: Path, cli) -> None:
    library = ["/venv/lib/python3.11/site-packages/lightning/pytorch/strategies/ddp.py", 330, "reduce",
               "lightning"]
    run = write_recording(tmp_path / "run", [], {0: [call(0, ["/job/train.py", 41, "main", None], library)]})
    result = cli("report", str(run))
    assert "strategies/ddp.py:330 ← /job/train.py:41" in result.stdout, result.stdout


def test_report_exits_as_the_run_did_and_strict_counts_warnings(tmp_path: Path, cli) -> None:
    warned = write_recording(tmp_path / "warned", [WARNING], {0: []})
    assert cli("report", str(warned)).returncode == 0  # `ddpdoctor run` exited 0 on it
    assert cli("report", str(warned), "--strict").returncode == 1
    assert cli("report", str(write_run(tmp_path / "failed"))).returncode == 1


def test_markdown_names_a_rank_once_per_line(tmp_path: Path, cli) -> None:
    evidence = (Evidence("rank 0: dead", rank=0), Evidence("killed by SIGKILL", rank=1))
    dead = Finding(class_="dead-rank", message="rank 0 died", evidence=evidence)
    result = cli("report", str(write_recording(tmp_path / "run", [dead], {})), "--format", "markdown")
    assert "[rank 0] rank 0: dead" not in result.stdout and "rank 0: dead" in result.stdout
    assert "[rank 1] killed by SIGKILL" in result.stdout


def test_the_html_page_is_readable_by_others_as_the_umask_allows(tmp_path: Path, cli) -> None:
    page = tmp_path / "run.html"
    assert cli("report", str(write_run(tmp_path / "run")), "--html", str(page)).returncode == 1
    assert page.stat().st_mode & 0o777 == 0o666 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
