"""The run directory's files and marks, the store's keys and the control key's states; the one catch-all."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch.distributed as dist

from ddpdoctor.failsafe import attempt, failsafe
from ddpdoctor.guard.protocol import Control, ControlValue, Mark, RunDir, StoreKeys, atomic_write_json


def test_the_control_key_reads_as_its_state_and_the_judge_of_a_verdict() -> None:
    assert ControlValue.parse("idle") == ControlValue(Control.IDLE)
    assert ControlValue.parse("") == ControlValue(Control.IDLE)  # not set yet
    assert ControlValue.parse("suspect").state is Control.SUSPECT
    assert ControlValue.parse("leaving").state is Control.LEAVING
    assert ControlValue.parse(ControlValue.verdict_of(3)) == ControlValue(Control.VERDICT, 3)


def test_each_restart_and_each_new_default_group_has_keys_of_its_own() -> None:
    first, restarted, regrouped = StoreKeys(), StoreKeys(restart="1"), StoreKeys(generation=2)
    keys = [k.control for k in (first, restarted, regrouped)] + [first.rank(0), first.chain("0", 8)]
    assert keys == [
        "ddpdoctor/0/control",
        "ddpdoctor/1/control",
        "ddpdoctor/0/g2/control",
        "ddpdoctor/0/rank/0",
        "ddpdoctor/0/chain/0/8",
    ]


def test_a_mark_is_claimed_once_across_processes_sharing_the_directory(tmp_path: Path) -> None:
    files = RunDir(str(tmp_path))
    assert not files.has(Mark.REPORTED)
    files.set_mark(Mark.REPORTED, 1)
    assert files.has(Mark.REPORTED) and (tmp_path / "reported").read_text() == "1"
    assert files.claim(Mark.ADOPTED) and not files.claim(Mark.ADOPTED)
    RunDir(str(tmp_path / "gone")).set_mark(Mark.PRINTED, 0)  # a directory already removed: no error


def test_a_rank_s_files_are_found_by_rank(tmp_path: Path) -> None:
    files = RunDir(str(tmp_path))
    for rank in (0, 3):
        atomic_write_json(files.meta(rank), {"rank": rank})
    (tmp_path / "rank-x.meta.json").write_text("{}")  # not a rank's
    assert sorted(rank for rank, _ in files.metas()) == [0, 3]
    assert files.flight(3).endswith("rank-3.flight") and files.exit_record(3).endswith("rank-3.exit.json")


def test_a_json_file_is_replaced_whole_and_a_failed_write_leaves_the_old_one(tmp_path: Path) -> None:
    path = str(tmp_path / "report.json")
    atomic_write_json(path, {"old": True})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"not json": object()})
    assert json.loads(Path(path).read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary file left


def test_a_swallowed_exception_is_silent_unless_debugging(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    store = dist.HashStore()
    monkeypatch.delenv("DDPDOCTOR_DEBUG", raising=False)
    with failsafe("test: reading a key nobody set"):
        store.set_timeout(datetime.timedelta(milliseconds=10))
        store.get("missing")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("DDPDOCTOR_DEBUG", "1")
    assert attempt("test: a key nobody set", lambda: store.get("missing"), b"default") == b"default"
    printed = capsys.readouterr().err
    assert "[ddpdoctor] debug: test: a key nobody set:" in printed and "Traceback" in printed
