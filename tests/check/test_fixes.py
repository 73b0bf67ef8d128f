"""`--fix`, `--unsafe-fixes`, `--diff`: the `.in.py` fixtures become exactly their `.out.py` twins, keep
formatting and comments, and a second run changes nothing."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

FIXES = Path(__file__).parent / "fixtures" / "fixes"
PAIRS = [
    ("DDP101_log", ["--fix"]),
    ("DDP101_move", ["--fix"]),
    ("DDP402_cuda", ["--fix", "--unsafe-fixes"]),
]


@pytest.mark.parametrize("name, flags", PAIRS)
def test_fix_turns_in_into_out_and_is_idempotent(check, tmp_path, name, flags):
    target = tmp_path / "module.py"
    shutil.copy(FIXES / f"{name}.in.py", target)
    first = check(str(target), "--isolated", *flags)
    assert "Fixed" in first.out
    expected = (FIXES / f"{name}.out.py").read_text(encoding="utf-8")
    assert target.read_text(encoding="utf-8") == expected
    second = check(str(target), "--isolated", *flags)
    assert "Fixed" not in second.out
    assert target.read_text(encoding="utf-8") == expected
    assert [p.name for p in tmp_path.iterdir()] == ["module.py"]  # no temporary file left behind


def test_after_the_fix_only_what_could_not_be_fixed_is_reported(check, tmp_path):
    target = tmp_path / "module.py"
    shutil.copy(FIXES / "DDP101_log.in.py", target)
    result = check(str(target), "--isolated", "--fix", "--format", "json")
    assert result.code == 1
    lines = target.read_text(encoding="utf-8").splitlines()
    left = [lines[f["line"] - 1].strip() for f in result.findings]
    assert all(line.endswith("# reported, not rewritten") for line in left) and len(left) == 2
    assert all(f["fix"]["edits"] == [] for f in result.findings)


def test_a_log_moves_out_of_its_rank_test_only_where_nothing_else_changes(check, tmp_path):
    """DDP101's safe fix moves `self.log(..., sync_dist=True)` out of the branch (every rank syncs); a log
    whose move could change what the program does is reported with `rank_zero_only=True` as the unsafe
    alternative (rank 0's value only, no sync)."""
    target = tmp_path / "module.py"
    shutil.copy(FIXES / "DDP101_move.in.py", target)
    result = check(str(target), "--isolated", "--fix", "--format", "json")
    lines = target.read_text(encoding="utf-8").splitlines()
    left = [lines[f["line"] - 1].strip() for f in result.findings]
    assert len(left) == 7 and all(line.endswith("# reported, not moved") for line in left), left
    assert {f["fix"]["applicability"] for f in result.findings} == {"unsafe"}
    assert all("rank_zero_only=True" in f["fix"]["message"] and "rank 0's shard only" in f["fix"]["message"]
               for f in result.findings)
    unsafe = check(str(target), "--isolated", "--fix", "--unsafe-fixes")
    assert "Fixed 7 findings" in unsafe.out
    assert target.read_text(encoding="utf-8").count("rank_zero_only=True)  # reported, not moved") == 7


def test_unsafe_fix_needs_the_flag(check, tmp_path):
    target = tmp_path / "module.py"
    shutil.copy(FIXES / "DDP402_cuda.in.py", target)
    before = target.read_text(encoding="utf-8")
    result = check(str(target), "--isolated", "--fix")
    assert result.code == 1
    assert target.read_text(encoding="utf-8") == before
    assert "--unsafe-fixes" in result.out


def test_diff_shows_and_writes_nothing(check, tmp_path):
    target = tmp_path / "module.py"
    shutil.copy(FIXES / "DDP101_log.in.py", target)
    before = target.read_bytes()
    result = check(str(target), "--isolated", "--diff")
    assert result.code == 1
    assert target.read_bytes() == before
    assert '-            self.log("val_score",   1.0,  sync_dist=True)  # keep me' in result.out
    assert '+        self.log("val_score",   1.0,  sync_dist=True)  # keep me' in result.out
    assert "-        if self.trainer.is_global_zero:" in result.out
    assert "Would fix 2 findings." in result.err


def test_fix_keeps_crlf_and_permissions(check, tmp_path):
    target = tmp_path / "module.py"
    source = (FIXES / "DDP101_log.in.py").read_text(encoding="utf-8")
    target.write_bytes(source.replace("\n", "\r\n").encode("utf-8"))
    os.chmod(target, 0o640)
    check(str(target), "--isolated", "--fix")
    fixed = target.read_bytes().decode("utf-8")
    expected = (FIXES / "DDP101_log.out.py").read_text(encoding="utf-8").replace("\n", "\r\n")
    assert fixed == expected
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640


def test_fix_keeps_a_byte_order_mark(check, tmp_path):
    target = tmp_path / "module.py"
    source = (FIXES / "DDP101_log.in.py").read_text(encoding="utf-8")
    target.write_bytes(b"\xef\xbb\xbf" + source.encode("utf-8"))
    check(str(target), "--isolated", "--fix")
    expected = (FIXES / "DDP101_log.out.py").read_text(encoding="utf-8")
    assert target.read_bytes() == b"\xef\xbb\xbf" + expected.encode("utf-8")


@pytest.mark.parametrize(("fixture", "advice"), [
    ("bad.py", "`if dist.get_rank() == 0:`), then `dist.barrier()`"),
    ("bad_lightning_script.py", "`trainer.save_checkpoint(path)` on every rank, which Lightning writes once"),
    ("bad_hf_trainer_save_pretrained.py", "pass `is_main_process=`"),
])
def test_the_checkpoint_race_fix_speaks_the_programs_framework(check, fixtures, fixture, advice):
    """DDP601's advice in the program's own terms: torch's rank test and barrier, the Lightning trainer's
    (whose `save_checkpoint` already writes once), transformers' `is_main_process=` argument."""
    outcome = check("--format", "json", "--select", "DDP601", str(fixtures / "DDP601" / fixture))
    fixes = [finding["fix"]["message"] for finding in outcome.findings]
    assert fixes and all(advice in fix for fix in fixes), fixes
