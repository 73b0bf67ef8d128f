"""Decisions from the files ranks leave in a run directory, written by the guard's own writers (the flight
file a rank maps, its meta file, its exit record), read back by `records_from_run_dir` as `ddpdoctor run`
does after the job, and judged by `decide` / `died_first`."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from ddpdoctor.guard.fingerprint import CollectiveFingerprint, CollectiveSignature
from ddpdoctor.guard.host import this_host
from ddpdoctor.guard.judge.records import records_from_run_dir, write_exit_record
from ddpdoctor.guard.judge.verdict import Decision, decide, died_first
from ddpdoctor.guard.model import Frame, RankState
from ddpdoctor.guard.rank.flight import FlightFile
from ddpdoctor.guard.rank.own_record import write_meta


def _gone_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


class Rank:
    """One rank's files, as its guard writes them."""

    def __init__(self, run_dir: Path, rank: int, *, alive: bool, seqs: dict[str, int] | None = None) -> None:
        self.runtime = SimpleNamespace(rank=rank, world_size=2, run_dir=str(run_dir),
                                       sequence_numbers=lambda: dict(seqs or {}))
        write_meta(self.runtime, this_host())
        if not alive:  # the meta file names the process that wrote it: a process that is gone
            meta = run_dir / f"rank-{rank}.meta.json"
            meta.write_text(meta.read_text().replace(f'"pid":{os.getpid()}', f'"pid":{_gone_pid()}'))
        self.flight = FlightFile(str(run_dir / f"rank-{rank}.flight"), slots=8)
        self.index = 0

    def call(self, op: str = "all_reduce", shape: int = 4, seq: int | None = None, done: bool = True) -> None:
        self.index += 1
        signature = CollectiveSignature("0", op, "SUM" if op == "all_reduce" else None, None, [[shape]], ["float32"],
                                        ["cpu"], Frame("/job/train.py", 10 + self.index, "main", None), None)
        fp = CollectiveFingerprint(self.index, self.index - 1 if seq is None else seq, time.time(), signature)
        self.flight.enter(fp)
        if done:
            self.flight.finish(fp, True)

    def exits(self) -> None:
        write_exit_record(self.runtime, None)


def judged(run_dir: Path) -> Decision | None:
    records = records_from_run_dir(str(run_dir))
    verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=float("inf"))
    return verdict.decision if verdict is not None else None


def test_a_shape_mismatch_left_in_two_flight_files(tmp_path: Path) -> None:
    zero, one = Rank(tmp_path, 0, alive=False), Rank(tmp_path, 1, alive=False)
    zero.call(shape=3, done=False)
    one.call(shape=5, done=False)
    assert judged(tmp_path) is Decision.MISMATCH


def test_a_rank_that_exited_without_the_call(tmp_path: Path) -> None:
    zero, one = Rank(tmp_path, 0, alive=False), Rank(tmp_path, 1, alive=True, seqs={"0": 1})
    zero.call()
    zero.call(done=False)
    one.call()
    one.exits()
    records = records_from_run_dir(str(tmp_path))
    assert records[1].state is RankState.EXITED and records[0].state is RankState.DEAD
    assert judged(tmp_path) is Decision.PEER_EXITED


def test_a_rank_past_the_call_through_cpp_collectives(tmp_path: Path) -> None:
    zero, one = Rank(tmp_path, 0, alive=False), Rank(tmp_path, 1, alive=False, seqs={"0": 4})
    zero.call()
    zero.call(done=False)
    one.call()
    write_exit_record(one.runtime, RuntimeError("Connection reset by peer"))  # its exit record: seq 4
    assert judged(tmp_path) is Decision.PASSED_OUTSIDE_PYTHON


def test_a_rank_that_died_while_its_peer_waited(tmp_path: Path) -> None:
    zero, one = Rank(tmp_path, 0, alive=True), Rank(tmp_path, 1, alive=False)
    zero.call()
    zero.call(done=False)
    one.call()
    assert judged(tmp_path) is Decision.PEER_DEAD


def test_a_rank_that_died_first_with_nobody_waiting(tmp_path: Path) -> None:
    zero, one = Rank(tmp_path, 0, alive=False), Rank(tmp_path, 1, alive=False)
    zero.call()
    one.call()
    records = records_from_run_dir(str(tmp_path))
    assert decide(records, 2, dead=set(), grace=0.0, hang_after=float("inf")) is None
    assert died_first(records, 2, {1}).decision is Decision.DIED_FIRST
