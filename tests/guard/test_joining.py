"""Ranks that cannot join their process group (guard/rank/joining.py): torch waits 30 minutes in
`init_process_group` without a word; under `ddpdoctor run` the job ends after --hang-after with a report."""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch.distributed as dist
from guard_jobs import (
    FIXTURES,
    PYTHON,
    TORCHRUN,
    fixture_line,
    free_port,
    guarded,
    report_of,
    run_job,
    run_passing_job,
)

from ddpdoctor.guard.host import pid_alive
from ddpdoctor.guard.rank.joining import (
    JoinAttempt,
    JoinState,
    StartingPeer,
    attempt_from_call,
    joining_finding,
    starting_peers,
)


def pids(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"rank \d: pid (\d+)", output)]


def test_a_rank_whose_store_nobody_listens_on_is_reported_after_hang_after(tmp_path: Path) -> None:
    port = free_port()  # free: nothing listens there
    started = time.monotonic()
    result = run_job(
        guarded(PYTHON, "joining.py", "unreachable", str(port), hang_after=3, report=tmp_path), timeout=60
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.output[-3000:]
    # long before the store's own timeout (torch's default, 30 min); generous: start-up is slow under load
    assert elapsed < 55, f"the job ended {elapsed:.0f} s after it started"
    assert result.output.count("ddpdoctor: process-group-missing") == 1, result.output[-3000:]
    [finding] = report_of(tmp_path)
    assert finding.class_ == "process-group-missing"
    assert finding.message.startswith(
        f"rank 1 cannot join the process group: the rendezvous store at 127.0.0.1:{port} cannot be reached "
        "(connection refused); init_process_group has been trying for "
    ), finding.message
    assert (Path(finding.locations[0].path).name, finding.locations[0].line) == (
        "joining.py",
        fixture_line("joining.py", "env-init"),
    )
    assert "start rank 0" in finding.fix.message and "MASTER_ADDR" in finding.fix.message
    assert finding.facts["stage"] == "store-unreachable"
    assert not any(pid_alive(pid) for pid in pids(result.output))


def test_fewer_ranks_than_world_size_are_reported_once_for_the_host(tmp_path: Path) -> None:
    result = run_job(guarded(PYTHON, "joining.py", "world-size", hang_after=3, report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    # One report for the two stuck ranks, printed before mp.spawn's own traceback of the exit it saw.
    assert result.output.count("ddpdoctor: collective-timeout") == 1, result.output[-3000:]
    assert result.output.index("ddpdoctor: collective-timeout") < result.output.index(
        "ProcessExitedException"
    )
    [finding] = report_of(tmp_path)
    assert finding.class_ == "collective-timeout"
    line = fixture_line("joining.py", "spawned-init")
    assert re.match(
        rf"ranks 0, 1 have waited \d+ s in init_process_group at \S*joining\.py:{line} in worker for the "
        r"rest of the "
        r"group to join: world_size is 3; ranks started on this host: 0, 1$",
        finding.message,
    ), finding.message
    assert sorted(finding.facts["ranks"]) == ["0", "1"]
    assert "mp.spawn(nprocs=...)" in finding.fix.message
    assert len(pids(result.output)) == 2 and not any(pid_alive(pid) for pid in pids(result.output))


def test_torchrun_with_master_port_0_is_told_to_use_standalone(tmp_path: Path) -> None:
    """torchrun --master-port 0 (no rendezvous backend) hands its workers MASTER_PORT=0: they retry
    127.0.0.1:0 for 30 minutes."""
    command = [TORCHRUN, "--nproc-per-node=2", "--master-port=0", str(FIXTURES / "joining.py"), "torchrun"]
    result = run_job(guarded(*command, hang_after=3, report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    [finding] = report_of(tmp_path)
    assert finding.class_ == "process-group-missing"
    assert finding.message.startswith(
        "ranks 0, 1 cannot join the process group: the rendezvous store at 127.0.0.1:0 cannot be reached "
        "(invalid port)"
    ), finding.message
    assert "--standalone" in finding.fix.message
    assert not any(pid_alive(pid) for pid in pids(result.output))


def test_ranks_that_join_are_untouched(tmp_path: Path) -> None:
    result = run_passing_job(guarded(PYTHON, "joining.py", "fixed", hang_after=3, report=tmp_path),
                             proof="rank 1: joined", timeout=60)
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: joined, sum 2" in result.output and "rank 1: joined, sum 2" in result.output
    assert "ddpdoctor" not in result.output
    assert report_of(tmp_path) == []


def test_the_attempt_is_read_from_the_call_and_the_environment() -> None:
    init = dist.init_process_group
    env = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "8"}
    attempt = attempt_from_call(init, ("nccl",), {}, env, None)
    assert (attempt.store, attempt.rank, attempt.world_size, attempt.backend) == (
        "10.0.0.5:29500",
        3,
        8,
        "nccl",
    )
    attempt = attempt_from_call(
        init, (), {"init_method": "tcp://node1:1234", "rank": 0, "world_size": 2}, env, None
    )
    assert (attempt.store, attempt.rank, attempt.world_size) == ("node1:1234", 0, 2)
    attempt = attempt_from_call(
        init, (), {"init_method": "file:///tmp/rdzv", "rank": 1, "world_size": 2}, {}, None
    )
    assert (attempt.store, attempt.rendezvous) == (None, "file:///tmp/rdzv")


def test_a_file_rendezvous_without_an_address_reads_as_waiting_for_ranks() -> None:
    attempt = JoinAttempt(rank=0, world_size=4, backend="gloo", store=None, rendezvous="file:///tmp/rdzv",
                          frame=("/job/train.py", 12, "main"))
    state = JoinState(
        attempt,
        pid=1,
        host="h",
        waited=301.2,
        torch_frame="_new_process_group_helper",
        reachable=None,
        probe="no address to try",
    )
    assert JoinState.from_json(state.to_json()) == state  # as a peer reads it from the run directory
    finding = joining_finding([state])
    assert finding.message == (
        "rank 0 has waited 301 s in init_process_group at /job/train.py:12 in main for the rest of the group "
        "to join: world_size is 4; ranks started on this host: 0"
    )
    assert finding.facts["stage"] == "waiting-for-ranks" and finding.class_ == "collective-timeout"


def test_a_rank_still_starting_is_waited_for_not_reported(tmp_path: Path) -> None:
    """torchrun: rank 1 reaches init_process_group 9 s late (a slow import on a busy machine) while rank 0
    has waited there past --hang-after 3: no report, the job trains (it was reported as stuck before)."""
    command = [TORCHRUN, "--nproc-per-node=2", "--standalone", str(FIXTURES / "joining.py"), "slow", "9"]
    result = run_passing_job(
        guarded(*command, hang_after=3, report=tmp_path), proof="rank 1: joined", timeout=90
    )
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: joined, sum 2" in result.output and "rank 1: joined, sum 2" in result.output
    assert "ddpdoctor" not in result.output
    assert report_of(tmp_path) == []


def test_a_worker_relaunched_lightning_style_is_waited_for(tmp_path: Path) -> None:
    """Lightning starts the script again for the other local ranks (LOCAL_RANK=1 in the environment); that
    child importing for longer than --hang-after is still starting, not missing."""
    result = run_passing_job(guarded(PYTHON, "joining.py", "relaunch", "9", hang_after=3, report=tmp_path),
                             proof="rank 1: joined", timeout=90)
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: joined, sum 2" in result.output and "rank 1: joined, sum 2" in result.output
    assert "ddpdoctor" not in result.output
    assert report_of(tmp_path) == []


def test_starting_peers_are_the_job_s_would_be_ranks_that_have_not_said_they_are_stuck(
    tmp_path: Path,
) -> None:
    import os
    import subprocess
    import sys

    def start(**env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={**os.environ, "DDPDOCTOR_RUN_DIR": str(tmp_path), **env})

    peer, other_job, launcher = start(RANK="1"), start(RANK="1", DDPDOCTOR_RUN_DIR="/elsewhere"), start()
    try:
        assert starting_peers(str(tmp_path), []) == (StartingPeer(peer.pid, 1),)
        # once rank 1 says it is stuck itself (its joining file), it is no longer on its way
        attempt = JoinAttempt(
            rank=1, world_size=2, backend="gloo", store=None, rendezvous="env://", frame=None
        )
        stuck = JoinState(
            attempt, pid=1, host="h", waited=5.0, torch_frame=None, reachable=True, probe="answers"
        )
        assert starting_peers(str(tmp_path), [stuck]) == ()
    finally:
        for process in (peer, other_job, launcher):
            process.kill()
            process.wait()


def test_a_rank_that_never_reaches_init_is_named_in_the_report() -> None:
    attempt = JoinAttempt(rank=0, world_size=2, backend="gloo", store="127.0.0.1:29500", rendezvous="env://",
                          frame=("/job/train.py", 12, "main"))
    state = JoinState(
        attempt,
        pid=10,
        host="h",
        waited=65.0,
        torch_frame=None,
        reachable=True,
        probe="answers",
        starting=(StartingPeer(11, 1),),
    )
    assert JoinState.from_json(state.to_json()) == state
    finding = joining_finding([state])
    assert finding.message.endswith(
        "world_size is 2; ranks started on this host: 0; started but not in init_process_group yet: rank 1 "
        "(pid 11)"
    )
    assert "py-spy dump --pid" in finding.fix.message
