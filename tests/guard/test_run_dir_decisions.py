"""Decisions from the files ranks leave in a run directory, written by the guard's own writers (the flight
file a rank maps, its meta file, its exit record), read back by `records_from_run_dir` as `ddpdoctor run`
does after the job, and judged by `decide` / `died_first`: first written here call by call, then left by a
real 2-rank job (one job, one scene per decision). Every `Decision` member is reached."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from guard_jobs import FIXTURES, PYTHON, fixture_line, free_port, job_env
from processes import kill_session

from ddpdoctor.guard.fingerprint import CollectiveFingerprint, CollectiveSignature
from ddpdoctor.guard.host import this_host
from ddpdoctor.guard.judge.records import records_from_run_dir
from ddpdoctor.guard.judge.verdict import Decision, decide, died_first
from ddpdoctor.guard.rank.flight import FlightFile
from ddpdoctor.guard.rank.own_record import write_exit_record, write_meta
from ddpdoctor.records import Frame, RankRecord, RankState


def _gone_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


class Rank:
    """One rank's files, as its guard writes them."""

    def __init__(self, run_dir: Path, rank: int, *, alive: bool, seqs: dict[str, int] | None = None) -> None:
        self.runtime = SimpleNamespace(rank=rank, world_size=2, run_dir=str(run_dir),
                                       identity=lambda: (rank, 2, str(run_dir)),
                                       sequence_numbers=lambda: dict(seqs or {}))
        write_meta(self.runtime, this_host())
        if not alive:  # the meta file names the process that wrote it: a process that is gone
            meta = run_dir / f"rank-{rank}.meta.json"
            meta.write_text(meta.read_text().replace(f'"pid":{os.getpid()}', f'"pid":{_gone_pid()}'))
        self.flight = FlightFile(str(run_dir / f"rank-{rank}.flight"), slots=8)
        self.index = 0

    def call(self, op: str = "all_reduce", shape: int = 4, seq: int | None = None, done: bool = True) -> None:
        self.index += 1
        signature = CollectiveSignature(
            "0",
            op,
            "SUM" if op == "all_reduce" else None,
            None,
            [[shape]],
            ["float32"],
            ["cpu"],
            Frame("/job/train.py", 10 + self.index, "main", None),
            None,
        )
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


# ---- the same rules on a real 2-rank job's run directory -------------------------------------------------
class SceneJob:
    """run_dir_scenes.py on two ranks, each a process of its own (killed by pid at the end)."""

    def __init__(self, tmp_path: Path) -> None:
        self.run_dir = tmp_path / "run"
        self.control = tmp_path / "control"
        self.run_dir.mkdir()
        self.control.mkdir()
        env = job_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            WORLD_SIZE="2",
            DDPDOCTOR_RUN_DIR=str(self.run_dir),
            DDPDOCTOR_HANG_AFTER="600",
            DDPDOCTOR_HEARTBEAT="600",
        )
        self.ranks = [
            subprocess.Popen([PYTHON, str(FIXTURES / "run_dir_scenes.py"), str(self.control)],
                             env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for rank in (0, 1)
        ]

    def records_when(
        self, ready: Callable[[dict[int, RankRecord]], bool], timeout: float = 30.0
    ) -> dict[int, RankRecord]:
        """The run directory's records once `ready` says the scene is in place."""
        deadline = time.monotonic() + timeout
        while True:
            records = records_from_run_dir(str(self.run_dir))
            if len(records) == 2 and ready(records):
                return records
            if time.monotonic() > deadline:
                raise AssertionError(f"scene not reached: {records}\n" + self.output())
            time.sleep(0.05)

    def go(self, scene: int) -> None:
        (self.control / f"go-{scene}").touch()

    def output(self) -> str:
        self.kill()
        return "\n".join((p.communicate(timeout=10)[0] or "")[-2000:] for p in self.ranks)

    def kill(self) -> None:
        for process in self.ranks:
            kill_session(process.pid)
            process.wait(timeout=10)


def _in(op: str) -> Callable[[RankRecord], bool]:
    return lambda r: r.current is not None and r.current.op == op


def _at(record: RankRecord, line: int) -> bool:
    """Whether a rank is in the call it made at this line of the fixture."""
    return record.current is not None and record.current.site is not None and record.current.site.line == line


def test_a_real_jobs_run_directory_is_judged_scene_by_scene(tmp_path: Path) -> None:
    job = SceneJob(tmp_path)
    try:
        # 1: rank 0 in an all_reduce, rank 1 running elsewhere
        elsewhere = fixture_line("run_dir_scenes.py", "elsewhere")
        records = job.records_when(lambda rs: _at(rs[0], elsewhere) and rs[1].current is None)
        verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=0.0)
        assert verdict is not None and verdict.decision is Decision.PEERS_ELSEWHERE, verdict
        assert f"run_dir_scenes.py:{elsewhere}" in verdict.headline
        # ...and not before --hang-after: rank 1 may just be slow
        assert decide(records, 2, dead=set(), grace=0.0, hang_after=600.0) is None
        first = records[0].current
        assert first is not None
        job.go(1)
        # 2: rank 0 in the default group's all_reduce, rank 1 in the other group's
        records = job.records_when(lambda rs: _in("all_reduce")(rs[0]) and rs[0].current.seq > first.seq
                                   and _in("all_reduce")(rs[1]) and rs[1].current.group != first.group)
        verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=0.0)
        assert verdict is not None and verdict.decision is Decision.PEER_IN_OTHER_COLLECTIVE, verdict
        job.go(2)
        # 3: both in one all_reduce that neither is seen to complete
        stuck = fixture_line("run_dir_scenes.py", "stuck")
        records = job.records_when(lambda rs: all(_at(r, stuck) for r in rs.values()))
        verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=0.0)
        assert verdict is not None and verdict.decision is Decision.ALL_STUCK, verdict
        job.go(3)
        # 4: the all_reduce passed with SUM on rank 0 and MAX on rank 1, found behind rank 0's wait
        records = job.records_when(lambda rs: rs[1].current is None and rs[1].last is not None
                                   and rs[1].last.reduce_op == "MAX" and _in("all_reduce")(rs[0])
                                   and rs[0].current.seq > rs[1].last.seq)
        verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=600.0)  # decidable at once
        assert verdict is not None and verdict.decision is Decision.COMPLETED_MISMATCH, verdict
        assert verdict.headline.startswith("ReduceOp mismatch: rank 0 all_reduce(SUM)"), verdict.headline
        job.go(4)
        # 5: rank 1 raised while rank 0 computed; the launcher would then stop rank 0
        assert job.ranks[1].wait(timeout=30) != 0
        job.records_when(lambda rs: rs[0].current is None)  # released by rank 1's last all_reduce
        job.kill()
        records = records_from_run_dir(str(job.run_dir))
        assert all(r.state is RankState.DEAD for r in records.values())
        assert decide(records, 2, dead=set(), grace=0.0, hang_after=0.0) is None  # nobody waited
        verdict = died_first(records, 2, {1})
        assert verdict.decision is Decision.RAISED_FIRST, verdict
        raised = fixture_line("run_dir_scenes.py", "raise")
        assert "rank 1 raised RuntimeError: bad batch on rank 1" in verdict.headline, verdict.headline
        assert f"run_dir_scenes.py:{raised}" in verdict.headline, verdict.headline
    finally:
        job.kill()
