"""`ddpdoctor run` on real jobs whose report must name the cause: the first rank to fail when the launcher
stopped the others before anyone waited, a job that never formed a process group, and the fix that
follows from how the waiting rank got to its call (a rank-conditional branch, not uneven batches)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from demo_runs import DEMO_LANE, example_line, guarded_example_run
from guard_jobs import (
    DDPDOCTOR,
    FIXTURES,
    VENV_BIN,
    fixture_line,
    free_port,
    guarded,
    job_env,
    ranks,
    report_of,
    run_job,
    run_passing_job,
    torchrun,
)

from ddpdoctor.findings import Severity

EVERY_RANK = "call the collective, or the helper that makes it, on every rank"
UNEVEN = "same number of batches"


def accelerate(*args: str) -> list[str]:
    return [str(VENV_BIN / "accelerate"), "launch", *args, "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no"]


def report_command(report_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DDPDOCTOR, "report", str(report_dir)], capture_output=True, text=True, timeout=60,
                          env=job_env(COLUMNS="200"))


def test_a_rank_raising_while_its_peer_computes_is_the_jobs_error(tmp_path: Path) -> None:
    """torchrun stops rank 0 with SIGTERM while it computes, before it waits in any collective: the report
    still names rank 1, its exception and the line that raised, and `ddpdoctor report` does not call the
    job clean."""
    result = run_job(guarded(*torchrun("bad_batch.py"), report=tmp_path / "out"), timeout=60)
    assert result.returncode == 1, result.output[-3000:]  # torchrun's own exit code for a failed worker
    findings = report_of(tmp_path / "out")
    assert len(findings) == 1, result.output[-3000:]
    finding = findings[0]
    line = fixture_line("bad_batch.py", "raise")
    assert finding.severity is Severity.ERROR and finding.class_ == "dead-rank"
    assert finding.facts["kind"] == "raised-first" and finding.facts["dead"] == [1]
    assert finding.message.startswith(
        f"rank 1 raised ValueError: bad batch at step 6: 3 labels for 4 samples at bad_batch.py:{line} in "
        "load_batch"
    ), finding.message
    assert "the launcher then stopped rank 0 with SIGTERM" in finding.message, finding.message
    assert (finding.locations[0].rank, finding.locations[0].line) == (1, line)
    assert "ValueError: bad batch at step 6" in result.output.split("ddpdoctor: dead-rank", 1)[-1]
    shown = report_command(tmp_path / "out")
    assert shown.returncode != 0, shown.stdout
    assert "clean" not in shown.stdout and "rank 1 raised ValueError" in " ".join(shown.stdout.split())


def test_the_bad_batch_fixed_form_is_clean(tmp_path: Path) -> None:
    result = run_passing_job(guarded(*ranks("bad_batch.py", "fixed"), report=tmp_path), "rank 1: done")
    assert result.returncode == 0, result.output[-3000:]
    assert report_of(tmp_path) == []
    assert "no process group" not in result.output
    assert report_command(tmp_path).returncode == 0


def test_accelerate_cpu_with_two_processes_says_no_process_group_formed(tmp_path: Path) -> None:
    """`accelerate launch --cpu --num_processes 2` starts one process: the job succeeds, and the guard says in
    one line that it never saw a process group, and why."""
    command = [*accelerate("--cpu", "--num_processes", "2"), str(FIXTURES / "accelerate_job.py"), "fixed"]
    result = run_passing_job(guarded(*command, report=tmp_path), "rank 0: total")
    assert result.returncode == 0, result.output[-3000:]
    said = [line for line in result.output.splitlines() if "no process group was formed" in line]
    assert len(said) == 1 and "`accelerate launch --cpu` starts one process" in said[0], result.output[-3000:]


@pytest.mark.parametrize("mode", [
    "broken",
    # slow: barriers on every rank around rank 0's save under DDP, guarded and silent, is the demo's guarded
    # examples/checkpoint-race/fixed.py (tests/demo, tests/examples)
    pytest.param("fixed", marks=pytest.mark.slow),
])
def test_a_barrier_in_a_helper_called_on_rank_zero_gets_the_every_rank_fix(tmp_path: Path, mode: str) -> None:
    """Rank 0 waits in the helper's barrier, rank 1 in the next backward: the same picture as uneven
    batches, but rank 0's stack runs through `if rank == 0 and ...`, so the fix is "every rank"."""
    if mode == "fixed":
        result = run_passing_job(
            guarded(*ranks("helper_barrier.py", "fixed"), report=tmp_path), "rank 1: done"
        )
        assert result.returncode == 0, result.output[-3000:]
        assert report_of(tmp_path) == []
        return
    result = run_job(guarded(*ranks("helper_barrier.py"), report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    barrier, branch = (
        fixture_line("helper_barrier.py", "barrier"),
        fixture_line("helper_barrier.py", "branch"),
    )
    assert finding.message.startswith(
        f"rank 0 waits in barrier at helper_barrier.py:{barrier} in save_checkpoint"
    ), finding.message
    assert f"through `if rank == 0 and step % 5 == 0:` at helper_barrier.py:{branch}" in finding.message
    assert finding.fix is not None and EVERY_RANK in finding.fix.message
    # the other cause is named, after: most likely first
    assert finding.fix.message.index(EVERY_RANK) < finding.fix.message.index("drop_last")


@pytest.mark.parametrize("mode", [
    "broken",
    # slow: an `accelerate launch` job whose every rank makes the same collectives ends clean under
    # `ddpdoctor run`, exit 0 and an empty report, in the default suite: tests/audits/test_runtime_loaders.py
    pytest.param("fixed", marks=pytest.mark.slow),
])
def test_accelerate_gather_on_the_main_process_only_gets_the_every_rank_fix(
    tmp_path: Path, mode: str
) -> None:
    command = [*accelerate("--multi_gpu", "--num_processes", "2", "--main_process_port", str(free_port())),
               str(FIXTURES / "accelerate_main_gather.py"), mode]
    if mode == "fixed":
        result = run_passing_job(guarded(*command, report=tmp_path), "rank 1: done", timeout=90)
        assert result.returncode == 0, result.output[-3000:]
        assert report_of(tmp_path) == []
        return
    result = run_job(guarded(*command, report=tmp_path), timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    gather, branch = (
        fixture_line("accelerate_main_gather.py", "gather"),
        fixture_line("accelerate_main_gather.py", "branch"),
    )
    assert finding.message.startswith("rank 0 waits in all_gather"), finding.message
    assert f"called from accelerate_main_gather.py:{gather}" in finding.message, finding.message
    assert (
        f"through `if accelerator.is_main_process:` at accelerate_main_gather.py:{branch}" in finding.message
    )
    assert finding.fix is not None and EVERY_RANK in finding.fix.message


@DEMO_LANE
def test_an_all_reduce_only_rank_zero_makes_meets_a_barrier_and_gets_the_every_rank_fix(
    request: pytest.FixtureRequest,
) -> None:
    """Two different collectives at one position (an op mismatch): rank 0 got to its all_reduce through
    `if rank == 0:`, so the fix is "every rank", with the loop-length cause after it. The job:
    examples/collective-divergence/broken.py under `ddpdoctor run`, the demo's run of it where this session
    made one (tests/demo_runs.py; test_run_jobs.py reads it too)."""
    job = guarded_example_run(request, "collective-divergence/broken")
    assert job.returncode == 1, job.output[-3000:]
    finding = report_of(job.report)[0]
    call, branch = example_line(job.run, "dist.all_reduce(loss)"), example_line(job.run, "if rank == 0:")
    assert finding.message.startswith("op mismatch: rank 0 all_reduce(SUM) [1] float32 vs rank 1 barrier"), \
        finding.message
    assert f"{job.run.script}:{call}" in finding.message, finding.message
    assert f"rank 0 got to its call through `if rank == 0:` at {job.run.script}:{branch}" in finding.message
    assert finding.fix is not None and EVERY_RANK in finding.fix.message
    assert finding.fix.message.index(EVERY_RANK) < finding.fix.message.index("drop_last")
    assert UNEVEN not in finding.fix.message  # the uneven-batches advice is for a peer in an extra backward


def test_a_rank_that_raised_is_first_even_when_the_deaths_were_not_seen_in_order() -> None:
    """The watcher woke after both deaths: the rank with an error of its own is the first; a rank whose
    error is the collective the other's death broke is not, nor is one of two that both raised."""
    from ddpdoctor.guard.launch.conclusion import raised_alone
    from ddpdoctor.records import CallRecord, CallState, RankRecord, RankState

    raised = RankRecord(1, state=RankState.DEAD, error="ValueError: bad batch")
    stopped = RankRecord(0, state=RankState.DEAD)
    broken = RankRecord(0, state=RankState.DEAD, error="RuntimeError: Connection closed by peer",
                        current=CallRecord(0, "0", 3, "all_reduce", state=CallState.FAILED))
    assert raised_alone({0: stopped, 1: raised}) == {1}
    assert raised_alone({0: broken, 1: raised}) == {1}
    assert raised_alone({0: RankRecord(0, state=RankState.DEAD, error="KeyError: 'x'"), 1: raised}) == set()
    assert raised_alone({0: RankRecord(0, state=RankState.EXITED), 1: raised}) == set()
