"""single-rank-long-section (F13): a rank that works alone while its peers wait is slow, not stuck.

The probe that tells the two apart (rank/progress.py) on real threads; the judge's decisions on records;
and two real 2-rank jobs under `ddpdoctor run`: one whose rank 0 evaluates alone past --hang-after (it must
finish, with a warning naming both lines) and one whose rank 0 works, then blocks in a `read` (a hang)."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from pathlib import Path

import pytest
from guard_jobs import fixture_line, guarded, ranks, report_of, run_job, run_passing_job
from record_builders import fp, rec

from ddpdoctor.guard.judge.long_section import long_section
from ddpdoctor.guard.judge.verdict import Decision, decide
from ddpdoctor.guard.rank.progress import MainThreadProgress
from ddpdoctor.records import RankRecord

SCRIPT = "long_section.py"


# ---- the probe, on real threads ------------------------------------------------------------------------
def _probe_of(target, *args) -> tuple[MainThreadProgress, threading.Thread]:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    time.sleep(0.05)
    probe = MainThreadProgress(thread.ident)
    for _ in range(6):
        probe.sample()
        time.sleep(0.05)
    return probe, thread


def _compute(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))  # Python work: the stack moves


def _one_long_c_call() -> None:
    # one C call that keeps a CPU busy for about a second without the GIL: the stack stands still, the
    # thread's CPU clock runs
    hashlib.pbkdf2_hmac("sha256", b"secret", b"salt", 800_000)


def test_a_computing_thread_moves_and_a_blocked_one_does_not() -> None:
    stop = threading.Event()
    computing, worker = _probe_of(_compute, stop)
    reader, writer = os.pipe()
    blocked, reading = _probe_of(os.read, reader, 1)
    sleeping, napping = _probe_of(time.sleep, 0.6)
    hashing, hasher = _probe_of(_one_long_c_call)
    try:
        assert computing.still_for() is not None and computing.still_for() < 0.2
        assert hashing.still_for() is not None and hashing.still_for() < 0.3
        assert blocked.still_for() is None  # never seen moving: judged as a stuck rank always was
        assert sleeping.still_for() is None
    finally:
        stop.set()
        os.write(writer, b"x")
        for thread in (worker, reading, napping, hasher):
            thread.join(5)
        os.close(reader)
        os.close(writer)


def _read_slowly(reader: int) -> None:
    while os.read(reader, 1):  # blocked in a read between the bytes: a download, a stream
        pass


def test_a_thread_blocked_in_reads_that_bring_bytes_moves() -> None:
    reader, writer = os.pipe()
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.02):
            os.write(writer, b"x")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    downloading, thread = _probe_of(_read_slowly, reader)
    try:
        assert downloading.still_for() is not None and downloading.still_for() < 0.2
    finally:
        stop.set()
        feeder.join(5)
        os.close(writer)
        thread.join(5)
        os.close(reader)


# ---- the judge -----------------------------------------------------------------------------------------
STACK = [("/job/eval.py", 12, "evaluate", None)]


def test_a_running_peer_is_no_hang_past_hang_after_and_a_still_one_is() -> None:
    running = {0: rec(0, fp(seq=3, op="barrier"), 20.0), 1: rec(1, stack=STACK, still_for=0.4)}
    assert decide(running, 2, dead=(), grace=0.0, hang_after=5.0) is None
    section = long_section(running, 2, dead=(), slow_after=10.0, hang_after=5.0)
    assert section is not None and section.waiting == (0,) and list(section.alone) == [1]
    assert "rank 1 has run alone for 20 s so far, in evaluate() at " in section.message
    assert "eval.py:12, while rank 0 waits in barrier " in section.message
    assert long_section(running, 2, dead=(), slow_after=30.0, hang_after=5.0) is None  # not yet
    # it stopped moving 6 s ago (a blocking read after the work): stuck, past --hang-after 5
    stuck = {**running, 1: rec(1, stack=STACK, still_for=6.0)}
    verdict = decide(stuck, 2, dead=(), grace=0.0, hang_after=5.0)
    assert verdict is not None and verdict.decision is Decision.PEERS_ELSEWHERE
    # never seen moving (asleep since before anyone looked): judged as before
    never = {**running, 1: rec(1, stack=STACK)}
    assert decide(never, 2, dead=(), grace=0.0, hang_after=5.0).decision is Decision.PEERS_ELSEWHERE


def test_a_peer_not_yet_sampled_twice_is_given_time_before_it_is_a_hang() -> None:
    # a monitor starved of the CPU (1.7 s between two samples at a load of 10 on 2 cores) has not said
    # whether its rank moves: the busy rank must not be taken for a stuck one at --hang-after
    unknown = {0: rec(0, fp(seq=3, op="barrier"), 2.3), 1: rec(1, progress_unknown=True)}
    assert decide(unknown, 2, dead=(), grace=0.0, hang_after=1.5) is None
    assert RankRecord.from_json(unknown[1].to_json()).progress_unknown
    # ... for a while: a monitor that never samples again is judged as a stuck rank was
    late = {**unknown, 0: rec(0, fp(seq=3, op="barrier"), 12.0)}
    assert decide(late, 2, dead=(), grace=0.0, hang_after=1.5).decision is Decision.PEERS_ELSEWHERE
    # the probe itself: unknown until its second sample
    probe = MainThreadProgress(threading.main_thread().ident)
    probe.sample()
    assert probe.unknown()
    probe.sample()
    assert not probe.unknown()


def test_a_wait_the_backend_timed_out_on_a_running_peer_is_this_class() -> None:
    failed = fp(seq=3, op="barrier", state="failed")
    records = {0: rec(0, failed, 1800.0), 1: rec(1, stack=STACK, still_for=0.2)}
    verdict = decide(records, 2, dead=(), grace=0.0, hang_after=300.0)
    assert verdict is not None and verdict.decision is Decision.PEER_ALONE
    assert verdict.class_ == "single-rank-long-section"
    assert "rank 1 is running alone in evaluate() at " in verdict.headline


# ---- real jobs -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alone_job(tmp_path_factory: pytest.TempPathFactory):
    report = tmp_path_factory.mktemp("alone")
    started = time.monotonic()
    command = guarded(*ranks(SCRIPT, "alone", "5"), hang_after=1.5, report=report)
    result = run_passing_job(command, timeout=90)
    return result, report_of(report), time.monotonic() - started


def test_a_rank_working_alone_past_hang_after_is_not_stopped(alone_job) -> None:
    result, findings, _ = alone_job
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: done" in result.output and "rank 1: done" in result.output
    assert [f.class_ for f in findings] == ["single-rank-long-section"]


def test_its_warning_names_both_lines_and_the_whole_wait(alone_job) -> None:
    result, findings, _ = alone_job
    finding = findings[0]
    evaluate, barrier = fixture_line(SCRIPT, "evaluate"), fixture_line(SCRIPT, "barrier")
    assert f"rank 0 ran alone for {finding.facts['waited_s']:.0f} s, in evaluate() at long_section.py:" \
        f"{evaluate}, while rank 1 waited in barrier at long_section.py:{barrier}" in finding.message
    assert finding.facts["ended"] is True and finding.facts["waited_s"] >= 3.5
    assert finding.facts["alone"] == [0] and finding.facts["waiting"] == [1]
    # the live note came while rank 0 still worked, and the summary lists the warning
    assert re.search(r"\[ddpdoctor\] note \(rank 1\): rank 0 has run alone for \d+ s so far, in evaluate\(\)",
                     result.output)
    assert "warning [single-rank-long-section]" in result.output


def test_a_rank_that_works_then_blocks_is_still_a_hang(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_job(guarded(*ranks(SCRIPT, "stuck-after-work", "2"), hang_after=2, report=tmp_path),
                     timeout=90)
    took = time.monotonic() - started
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "collective-timeout"
    assert f"rank 0 is running, not in a collective (at long_section.py:{fixture_line(SCRIPT, 'stuck')}" in (
        finding.message)
    # long before the barrier's timeout (torch's default, 30 min); generous: start-up is slow under load
    assert took < 80, took
