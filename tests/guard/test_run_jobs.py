"""`ddpdoctor run` on real multi-process jobs (gloo on the CPU): every failure the guard must name, and
the fixed forms it must leave alone."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from demo_runs import DEMO_LANE, demo_kept_runs, example_line, guarded_example_run, kept_run
from guard_jobs import (
    DDPDOCTOR,
    FIXTURES,
    PYTHON,
    SHARED_JOB_LANE,
    VENV_BIN,
    JobResult,
    deep_elsewhere_job,
    fixture_line,
    free_port,
    guarded,
    job_env,
    ranks,
    report_of,
    run_job,
    run_passing_job,
    torchrun,
    two_clean_torchruns,
)
from shared_jobs import shape_mismatch_job

from ddpdoctor.demo.manifest import all_examples
from ddpdoctor.explain import explain_paths
from ddpdoctor.guard.host import pid_alive

RUNS = [run for example in all_examples() for run in example.runs]


@pytest.mark.parametrize(
    ("mode", "headline"),
    [
        # examples/collective-divergence/broken.py: the demo's run of it (tests/demo_runs.py)
        pytest.param("rank-conditional", "op mismatch: rank 0 all_reduce(SUM) [1] float32 vs rank 1 barrier",
                     marks=DEMO_LANE),
        ("op", "op mismatch: rank 0 all_reduce(SUM) [4] float32 vs rank 1 broadcast(root=0) [4] float32"),
        pytest.param(
            "shape",
            "shape mismatch: rank 0 all_reduce(SUM) [3] float32 vs rank 1 all_reduce(SUM) [5] float32 at "
            "collectives.py:{shape}",
            marks=pytest.mark.xdist_group(SHARED_JOB_LANE),
        ),
        # slow (dtype, root): the default suite has each piece of these two: a real call's dtypes and root
        # recorded (tests/guard/test_intercept.py), the verdict on such records (test_verdict_rules.py), and
        # the whole way from a 2-rank job to report.json ([op], [shape] here)
        pytest.param(
            "dtype",
            "dtype mismatch: rank 0 all_reduce(SUM) [4] float32 vs rank 1 all_reduce(SUM) [4] float64",
            marks=pytest.mark.slow,
        ),
        (
            "reduce-op",
            "ReduceOp mismatch: rank 0 all_reduce(SUM) [4] float32 vs rank 1 all_reduce(MAX) [4] float32",
        ),
        pytest.param(
            "root",
            "root mismatch: rank 0 broadcast(root=0) [4] float32 vs rank 1 broadcast(root=1) [4] float32",
            marks=pytest.mark.slow,
        ),
        ("early-exit", "rank 0 waits in all_reduce(SUM) [4] float32 at collectives.py:{early-exit}"),
        (
            "sys-exit",
            "rank 0 waits in all_reduce(SUM) [4] float32 at collectives.py:{sys-exit}, but rank 1 finished",
        ),
    ],
)
def test_divergence_is_reported_with_ranks_ops_and_lines(
    request: pytest.FixtureRequest, tmp_path: Path, mode: str, headline: str
) -> None:
    script = "collectives.py"
    if mode == "rank-conditional":  # the same job as the demo's (tests/guard/test_run_causes.py reads it too)
        example = guarded_example_run(request, "collective-divergence/broken")
        result, report = JobResult(example.returncode, example.output), example.report
        elapsed = example.seconds
        script = example.run.script.name
    elif mode == "shape":  # the job tests/render/test_run_report_formats.py renders
        shape = shape_mismatch_job()
        result, elapsed, report = JobResult(shape.returncode, shape.output), shape.seconds, shape.report
    else:
        report = tmp_path
        started = time.monotonic()
        result = run_job(guarded(*ranks("collectives.py", mode), report=report), timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.output[-3000:]
    findings = report_of(report)
    assert findings and findings[0].class_ == "collective-divergence", result.output[-3000:]
    for marker in ("shape", "early-exit", "sys-exit"):
        headline = headline.replace("{" + marker + "}", str(fixture_line("collectives.py", marker)))
    assert headline in findings[0].message.replace("tests/guard/fixtures/", "")
    if mode == "shape":
        # gloo aborts the rank that receives more than it expects: named by its fault log in every run
        assert findings[0].facts["ranks"]["0"]["state"].startswith(
            "dead (killed by SIGABRT; in all_reduce(SUM) [3] float32"
        ), findings[0].facts["ranks"]["0"]
    # per-rank locations point at the job's lines
    assert {loc.rank for loc in findings[0].locations} == {0, 1}
    assert all(loc.path.endswith(script) for loc in findings[0].locations)
    # stacks show the job's frames, never the interpreter's exit handlers a leaving rank runs last
    for rank, row in findings[0].facts["ranks"].items():
        assert not [frame for frame in row["stack"] if frame[3] == "python"], (rank, row["stack"])
    # one report for the whole job, and long before any backend timeout (the fixture's group has torch's
    # default, 30 min); a generous bound: under load (parallel lanes, other work) a 2-rank job takes 30 s
    assert result.output.count("ddpdoctor: collective-divergence") == 1, result.output[-3000:]
    assert elapsed < 55, f"the job ended {elapsed:.0f} s after it started"
    # each rank's log starts with its first call: in collectives.py the all_reduce bound before the guard
    # patched torch.distributed; in the example, rank 0's all_reduce and rank 1's barrier
    first = {0: "all_reduce", 1: "barrier" if mode == "rank-conditional" else "all_reduce"}
    for rank in (0, 1):
        lines = (report / "job-1" / f"rank-{rank}.jsonl").read_text().splitlines()
        assert lines and json.loads(lines[0])["op"] == first[rank]
    if mode == "rank-conditional":
        call = example_line(example.run, "dist.all_reduce(loss)")
        assert_the_last_word_is_the_verdict(result.output, report, rank=0, where=f"{script}:{call}",
                                            log=tmp_path / "combined.log")


def assert_the_last_word_is_the_verdict(output: str, report: Path, rank: int, where: str, log: Path) -> None:
    """After everything torchrun printed (its error block and "Root Cause"), ddpdoctor's verdict: the
    culprit's rank, file:line, class and report; `explain` on the whole log (written to `log`) takes it as
    the first failure."""
    last = [line for line in output.splitlines() if line.strip()][-2:]
    assert last[0].startswith(f"[ddpdoctor] verdict: rank {rank} at "), output[-3000:]
    assert f"{where}, collective-divergence (report: {report / 'report.json'})" in last[0], last
    assert last[1].startswith("[ddpdoctor] torchrun's \"Root Cause\" above is the first rank"), last
    assert output.index("Root Cause (first observed failure)") < output.index("[ddpdoctor] verdict:")
    log.write_text(output)
    (diagnosis, *_) = explain_paths([str(log)]).diagnoses
    assert diagnosis.finding.facts["first_failed_rank"] == rank, diagnosis.finding.facts


def test_two_launchers_of_one_job_print_the_same_report(tmp_path: Path) -> None:
    """A two-node job, one `ddpdoctor run` per node (here two torchrun agents on this host): the node whose
    rank decided prints the report, and the other node's launcher prints the same one, not a verdict of
    its own from its own ranks' files (it printed a different headline before)."""
    port = free_port()
    results: dict[int, object] = {}

    def node(index: int) -> None:
        command = [str(VENV_BIN / "torchrun"), "--nnodes=2", f"--node-rank={index}", "--nproc-per-node=2",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-launchers",
                   str(FIXTURES / "collectives.py"), "rank-conditional"]
        results[index] = run_job(guarded(*command, report=tmp_path / f"node{index}"), timeout=90)

    threads = [threading.Thread(target=node, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    messages = []
    for index in (0, 1):
        result = results[index]
        assert isinstance(result, JobResult) and result.returncode == 1, getattr(result, "output", "")[-3000:]
        assert result.output.count("ddpdoctor: collective-divergence") == 1, result.output[-3000:]
        messages.append([f.message for f in report_of(tmp_path / f"node{index}")])
    assert messages[0] == messages[1] and messages[0][0].startswith(
        "op mismatch: rank 0 all_reduce(SUM) [1] float32"
    )


@pytest.mark.xdist_group(SHARED_JOB_LANE)
def test_clean_job_is_untouched() -> None:
    shared = two_clean_torchruns()  # the first of its two jobs (test_invisible.py reads both)
    result, report = shared.result, shared.report
    assert result.returncode == 0, result.output[-3000:]
    assert "ddpdoctor:" not in result.output
    assert report_of(report) == []
    records = [json.loads(line) for line in (report / "job-1" / "rank-1.jsonl").read_text().splitlines()]
    assert [r["op"] for r in records][-3:] == ["all_reduce", "broadcast", "barrier"]
    assert all(r["state"] == "done" for r in records)


@pytest.mark.parametrize(
    "mode", [pytest.param("elsewhere", marks=pytest.mark.xdist_group(SHARED_JOB_LANE)), "async-elsewhere"]
)
def test_peer_busy_elsewhere_becomes_a_verdict_after_hang_after_with_stacks(
    tmp_path: Path, mode: str
) -> None:
    """`async-elsewhere`: rank 0's all_reduce(async_op=True) returns at once and it blocks later in
    `work.wait()`, in C++ (what every NCCL collective looks like from Python): it must still count as
    waiting in that all_reduce until its Work completes."""
    line = fixture_line("collectives.py", mode)
    if mode == "elsewhere":  # the job test_report_output.py reads too (a deep copy, its stderr in a file)
        run = deep_elsewhere_job()
        result, report, shown = run.result, run.report, str(run.script)  # outside the cwd: named whole
    else:
        report, shown = tmp_path, "collectives.py"
        result = run_job(guarded(*ranks("collectives.py", mode), report=report, hang_after=3), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(report)[0]
    assert finding.class_ == "collective-timeout"
    assert f"rank 0 has waited 3 s in all_reduce(SUM) [4] float32 at {shown}:" in finding.message
    assert f"rank 1 is running, not in a collective (at {shown}:{line} in <module>)" in finding.message
    stack = finding.facts["ranks"]["1"]["stack"]
    assert any(frame[0].endswith("collectives.py") and frame[1] == line for frame in stack)


def test_killed_rank_is_named_dead(tmp_path: Path) -> None:
    result = run_job(guarded(*ranks("killed_rank.py"), report=tmp_path, hang_after=5), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "dead-rank", result.output[-3000:]
    assert "rank 1 died" in finding.message
    line = fixture_line("killed_rank.py", "all_reduce")
    # killed at step 5, before its sixth all_reduce: the last it completed is #4. The signal is named when
    # the peer read it before torchrun reaped the process (a tenth of a second at most).
    assert re.fullmatch(
        r"dead \((killed by SIGKILL; )?after all_reduce\(SUM\) \[8\] float32, #4 of group 0, at "
        rf"killed_rank.py:{line}\)",
        finding.facts["ranks"]["1"]["state"],
    ), finding.facts["ranks"]["1"]["state"]


@pytest.mark.parametrize(("mode", "signal_name"), [("segfault", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_rank_that_crashes_is_named_with_its_signal_and_the_line_it_crashed_on(
    tmp_path: Path, mode: str, signal_name: str
) -> None:
    """The crashing rank's fault log says both, in every run: the wait status alone is seen only when the
    process is caught as a zombie before torchrun reaps it, and it holds no line."""
    result = run_job(guarded(*torchrun("crashes.py", mode), report=tmp_path, hang_after=5), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "dead-rank", result.output[-3000:]
    crash, waits = fixture_line("crashes.py", mode), fixture_line("crashes.py", "all_reduce")
    assert finding.message.startswith(f"rank 1 died (killed by {signal_name}: "), finding.message
    # rank 0 waits in the all_reduce rank 1 never reaches, unless torchrun stops it (0.1 s after the crash)
    # before it has entered it: then the report says what rank 1 did last and that rank 0 was stopped
    call = rf"all_reduce\(SUM\) \[4\] float32 at crashes\.py:{waits}"
    assert re.search(rf"\) at crashes\.py:{crash} in load_batch "
                     rf"(?:while rank 0 waits in {call}|after {call}; the launcher then stopped rank 0)",
                     finding.message), finding.message
    assert (finding.locations[0].rank, finding.locations[0].line) == (1, crash)
    user_frames = [frame for frame in finding.facts["ranks"]["1"]["stack"] if frame[3] is None]
    assert user_frames[0][1:3] == [crash, "load_batch"], user_frames
    assert finding.fix is not None and "look at the native call made there" in finding.fix.message
    # the job still dies of the signal: torchrun reports the rank's own exit status
    assert f"Signal {6 if mode == 'abort' else 11} ({signal_name}) received by PID" in result.output


def test_rank_killed_while_the_other_is_outside_a_collective_is_named_dead(tmp_path: Path) -> None:
    """torchrun stops rank 0 (SIGTERM) a tenth of a second after rank 1 is killed, before rank 0 reaches
    a collective: no rank waited on the dead one, and only the order of the deaths names the cause."""
    result = run_job(
        guarded(*ranks("killed_rank.py", "outside"), report=tmp_path, hang_after=5), timeout=60
    )
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "dead-rank", result.output[-3000:]
    line = fixture_line("killed_rank.py", "all_reduce")
    # `ddpdoctor run` reads the exit status the moment the rank exits, unless torchrun reaped it first
    assert re.match(
        r"rank 1 died \((killed by SIGKILL: what the kernel's OOM killer sends|process gone, no Python "
        r"error)[^)]*\) "
        rf"after all_reduce\(SUM\) \[8\] float32 at killed_rank.py:{line}",
        finding.message,
    ), finding.message
    # with the signal, where its exit status was read before torchrun reaped it
    assert re.search(r"; the launcher then stopped rank 0( with SIGTERM)?$", finding.message), finding.message
    assert finding.facts["ranks"]["0"]["state"].startswith("stopped by the launcher outside a collective")
    assert "ddpdoctor: dead-rank" in result.output


def test_rank_skipping_a_backward_is_named_against_ddps_cpp_all_reduce(tmp_path: Path) -> None:
    """One rank skips a batch's backward (a NaN guard only it trips): its next Python all_reduce meets the
    peer's extra gradient all_reduce, which DDP issues from C++. gloo aborts one rank on the size mismatch
    and the other dies of the reset connection; the report must still say which rank went past which
    position, not blame a dead rank."""
    result = run_job(guarded(*ranks("skipped_batch.py", "broken"), report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "collective-divergence", result.output[-3000:]
    # Which rank gloo aborts on the size mismatch, and whether the verdict comes from rank 0's own post-mortem
    # (it still "waits in" its failed call) or after both processes are gone (it "was in" it), is a race
    # between the two processes: both reports are right, and either may come first.
    assert re.search(r"rank 0 (?:was|waits) in all_reduce\(SUM\) \[1\] float32 at skipped_batch\.py:30",
                     finding.message), finding.message
    # rank 1's gradient all_reduce is the collective at rank 0's position; rank 1 may have died in it, or
    # after
    assert re.search(r"but rank 1(?:'s #\d+ is| already passed #\d+ with) a collective issued outside Python",
                     finding.message), finding.message
    # rank 1's line, from what it said as it failed; torchrun may stop it first (0.1 s after rank 0's abort),
    # and then the position is known from rank 0's abort alone (gloo aborts on a message a peer sent)
    located = {(loc.rank, loc.line) for loc in finding.locations}
    assert (0, 30) in located
    if "stopped by the launcher outside a collective" not in finding.facts["ranks"]["1"]["state"]:
        assert re.search(r"\((?:died|now in backward) at skipped_batch\.py:27 in <module>\)",
                         finding.message), finding.message
        assert (1, 27) in located


def test_uneven_batches_name_the_rank_still_in_backward(tmp_path: Path) -> None:
    """One rank runs one more DDP backward (its gradient all_reduce comes from C++) while the other waits in
    the barrier after the loop: the report says the extra rank is in backward, at its line."""
    result = run_job(guarded(*ranks("uneven_batches.py"), report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "collective-divergence", result.output[-3000:]
    backward, barrier = (
        fixture_line("uneven_batches.py", "backward"),
        fixture_line("uneven_batches.py", "barrier"),
    )
    assert re.fullmatch(
        rf"rank 1 waits in barrier at uneven_batches\.py:{barrier} \(collective #(\d+) of group 0\), "
        r"but rank 0's #\1 is a collective issued outside Python \(from C\+\+, e\.g\. DDP's gradient "
        r"all_reduce\) "
        rf"\(now in backward at uneven_batches\.py:{backward} in <module>\)",
        finding.message,
    ), finding.message
    assert finding.facts["ranks"]["0"]["state"] == (
        f"in backward, not in a Python collective (at uneven_batches.py:{backward} in <module>)")
    assert finding.fix is not None and "same number of batches" in finding.fix.message


# slow: the guard's silence on a plain DDP loop is asserted in the default suite by
# test_clean_ddp_and_fsdp2_training_give_bit_identical_weights and by the demo's guarded fixed runs
# (examples/sampler-epoch, replica-divergence: tests/demo, tests/examples)
@pytest.mark.slow
def test_uneven_batches_fixed_form_is_clean(tmp_path: Path) -> None:
    result = run_passing_job(
        guarded(*ranks("uneven_batches.py", "fixed"), report=tmp_path), "rank 1: done"
    )
    assert result.returncode == 0, result.output[-3000:]
    assert report_of(tmp_path) == []


# slow: a DDP loop whose ranks agree on a skip with one all_reduce, guarded and silent; the default suite has
# the same silence on DDP loops and extra collectives
# (test_clean_ddp_and_fsdp2_training_give_bit_identical_weights, the demo's guarded
# examples/collective-divergence/fixed.py and sampler-epoch/fixed.py)
@pytest.mark.slow
def test_rank_skipping_a_batch_fixed_form_is_clean(tmp_path: Path) -> None:
    result = run_passing_job(guarded(*ranks("skipped_batch.py", "fixed"), report=tmp_path), "rank 1: done")
    assert result.returncode == 0, result.output[-3000:]
    assert result.output.count(": done, mean loss 0.2656") == 2
    assert report_of(tmp_path) == []


@DEMO_LANE
def test_backend_device_mismatch_names_tensor_group_and_line(request: pytest.FixtureRequest) -> None:
    """examples/backend-device-mismatch/broken.py (a CPU scalar all_reduced over a `cuda:gloo` group) under
    `ddpdoctor run`: the demo's run of it where this session made one (tests/demo_runs.py)."""
    job = guarded_example_run(request, "backend-device-mismatch/broken")
    assert job.returncode == 1, job.output[-3000:]
    assert (
        "tensor of shape [] dtype int64 on cpu, but process group '0' (cuda:gloo) has backends only for cuda"
        in job.output
    ), job.output[-3000:]
    assert "No backend type associated with device type cpu" in job.output
    finding = report_of(job.report)[0]
    assert finding.class_ == "backend-device-mismatch"
    assert finding.location is not None and finding.location.path == str(job.run.script)
    assert finding.location.line == example_line(job.run, "dist.all_reduce(total)")
    assert "cpu:gloo,cuda:nccl" in (finding.fix.message if finding.fix else "")


# slow: the demo runs examples/backend-device-mismatch/fixed.py, the same fix ("cpu:gloo,cuda:gloo" on the
# CPU), under `ddpdoctor run` and fails unless it exits 0 with no guard finding (tests/demo, tests/examples)
@pytest.mark.slow
def test_backend_device_fixed_form_is_clean(tmp_path: Path) -> None:
    result = run_passing_job(guarded(*ranks("backend_device.py", "fixed"), report=tmp_path), timeout=60)
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: result [6.0, 40.0]" in result.output
    assert report_of(tmp_path) == []


def test_remedy_runs_the_collective_correctly_and_warns_once_per_site(tmp_path: Path) -> None:
    result = run_passing_job(
        guarded(*ranks("backend_device.py", "broken"), report=tmp_path, remedy=True), timeout=60
    )
    assert result.returncode == 0, result.output[-3000:]
    # the same numbers the fixed job computes
    assert "rank 0: result [6.0, 40.0]" in result.output and "rank 1: result [6.0, 40.0]" in result.output
    assert result.output.count("[ddpdoctor] remedy:") == 2  # once per rank for the one call site
    findings = report_of(tmp_path)
    assert [f.severity.value for f in findings] == ["warning"]


def test_remedy_brings_back_in_place_results_and_refuses_a_reduction_it_cannot_run(tmp_path: Path) -> None:
    """The remedy runs a call on copies and copies back only what the call wrote: an output that is a view
    of its input gets the result, not the input over it. A PREMUL_SUM, which the gloo group it runs on
    cannot do, is refused (the finding, the job stopped) instead of run some other way."""
    result = run_job(guarded(*ranks("backend_device.py", "in-place"), report=tmp_path, remedy=True),
                     timeout=60)
    for rank in range(2):
        for what in ("reduce-scatter", "all-gather"):
            # by pattern, not by line: the two ranks' prints can land on one line of the merged output
            said = re.search(rf"rank {rank}: {what} in place (\[[^\]]*\]) expected (\[[^\]]*\])",
                             result.output)
            assert said is not None, result.output[-3000:]
            assert said.group(1) == said.group(2), said.group(0)
    assert result.returncode != 0 and "premul ran" not in result.output, result.output[-3000:]
    refused = [f for f in report_of(tmp_path) if f.severity.value == "error"]
    assert refused and refused[0].class_ == "backend-device-mismatch", result.output[-3000:]
    assert "not remedied: --remedy would run it on a gloo group, and gloo has no PREMUL_SUM" in (
        refused[0].message
    )
    assert refused[0].location is not None
    assert refused[0].location.line == fixture_line("backend_device.py", "premul")


def test_a_remedied_call_that_a_peer_never_makes_is_reported_as_a_hang(tmp_path: Path) -> None:
    """The remedy runs the call on a gloo group over the same ranks; it is guarded there like any other."""
    result = run_job(
        guarded(*ranks("backend_device.py", "remedied-hang"), report=tmp_path, remedy=True), timeout=60
    )
    assert result.returncode == 1, result.output[-3000:]
    finding = next(f for f in report_of(tmp_path) if f.class_ != "backend-device-mismatch")
    assert finding.class_ == "collective-timeout", finding.message
    waits = fixture_line("backend_device.py", "remedied-hang")
    elsewhere = fixture_line("backend_device.py", "elsewhere")
    assert re.match(
        rf"rank 0 has waited \d+ s in all_reduce\(SUM\) \[2\] float32 at backend_device.py:{waits} ",
        finding.message,
    ), finding.message
    assert (
        f"rank 1 is running, not in a collective (at backend_device.py:{elsewhere} in <module>)"
        in finding.message
    )


@pytest.mark.parametrize("mode", [
    "broken",
    # slow: an `accelerate launch --multi_gpu` job that ends clean under `ddpdoctor run`, exit 0 and an empty
    # report, is in the default suite: tests/audits/test_runtime_loaders.py (the prepared loader)
    pytest.param("fixed", marks=pytest.mark.slow),
])
def test_accelerate_launch_jobs_are_guarded(tmp_path: Path, mode: str) -> None:
    """`accelerate launch --multi_gpu` (on the CPU, gloo) runs torchrun's launcher inside accelerate's
    own process; its workers are guarded like torchrun's, and accelerate's frames name the user's line."""
    launch = [
        str(VENV_BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
    ]
    run = run_passing_job if mode == "fixed" else run_job
    result = run(guarded(*launch, str(FIXTURES / "accelerate_job.py"), mode, report=tmp_path), timeout=90)
    if mode == "fixed":
        assert result.returncode == 0, result.output[-3000:]
        assert (
            "rank 0: total [3.0, 3.0, 3.0]" in result.output
            and "rank 1: total [3.0, 3.0, 3.0]" in result.output
        )
        assert report_of(tmp_path) == []
        return
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    main_only = fixture_line("accelerate_job.py", "main-only")
    everyone = fixture_line("accelerate_job.py", "everyone")
    assert finding.message.startswith(
        "op mismatch: rank 0 all_gather out [3] [3] float32 vs rank 1 barrier"
    ), finding.message
    assert f"called from accelerate_job.py:{main_only} vs " in finding.message, finding.message
    assert f"called from accelerate_job.py:{everyone} (collective #1 of group 0)" in finding.message, (
        finding.message
    )


def test_a_collective_inside_a_compiled_graph_is_named_as_such(tmp_path: Path) -> None:
    """The guard sees a compiled graph's collective only through the group's sequence number; the report
    says so, and names the user's line below torch.fx's generated code."""
    result = run_job(guarded(*ranks("compiled.py"), report=tmp_path), timeout=120)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    barrier = fixture_line("compiled.py", "barrier")
    assert finding.message.startswith(
        f"rank 1 waits in barrier at compiled.py:{barrier} (collective #2 of group 0), "
        "but rank 0's #2 is a collective issued outside torch.distributed's Python "
        "functions (it runs a torch.compile'd graph"
    ), finding.message
    assert re.search(r"\(now at compiled\.py:\d+ in step\)$", finding.message), finding.message
    assert finding.facts["ranks"]["0"]["state"].startswith("running a compiled graph (torch.compile")


def test_an_fsdp2_extra_forward_on_one_rank_is_counted(tmp_path: Path) -> None:
    """Rank 0 runs one evaluation forward more than rank 1, under a rank test: sharded-step-divergence, with
    each rank's count of forward passes and the line of its last one, then the collectives. (Clean FSDP2
    training under the guard, silent and bit-identical to the plain run: test_clean_ddp_and_fsdp2_training_
    give_bit_identical_weights.)"""
    broken = run_job(guarded(*ranks("fsdp2_train.py", "broken"), report=tmp_path / "broken"), timeout=90)
    assert broken.returncode == 1, broken.output[-3000:]
    finding = report_of(tmp_path / "broken")[0]
    evaluate, barrier = (
        fixture_line("fsdp2_train.py", "rank-0-eval"),
        fixture_line("fsdp2_train.py", "barrier"),
    )
    assert finding.class_ == "sharded-step-divergence"
    assert finding.message.startswith(
        f"rank 0 ran 5 forward passes of the sharded `Sequential` (the last at fsdp2_train.py:{evaluate}), "
        f"rank 1 ran 4 (the last at fsdp2_train.py:{fixture_line('fsdp2_train.py', 'train-forward')})"
    ), finding.message
    assert "; op mismatch: rank 0 all_gather_single" in finding.message, finding.message
    assert "a sharded forward is a collective" in finding.fix.message  # the rank test's advice
    # FSDP's own frame is named as the issuer, above the user's line
    fsdp_frame = re.search(
        r"vs rank 1 barrier at (\S+), called from fsdp2_train.py:(\d+) vs fsdp2_train.py:(\d+)",
        finding.message,
    )
    assert fsdp_frame is not None, finding.message
    assert fsdp_frame[1].startswith("torch/distributed/fsdp/"), finding.message
    assert (int(fsdp_frame[2]), int(fsdp_frame[3])) == (evaluate, barrier)
    # reported within 10 s of the divergence: from the later rank's entry into its call to report.json
    entered = max(rank["fingerprint"]["time"] for rank in finding.facts["ranks"].values())
    assert (tmp_path / "broken" / "report.json").stat().st_mtime - entered < 10.0


def test_an_fsdp2_backward_skipped_on_one_rank_is_counted(tmp_path: Path) -> None:
    """Rank 1 skips the last `loss.backward()`: rank 0's backward waits in FSDP's all-gather, rank 1 in the
    barrier; the report leads with each rank's count of backward passes and the line of its last one."""
    result = run_job(guarded(*ranks("fsdp2_train.py", "skipped-backward"), report=tmp_path), timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    backward = fixture_line("fsdp2_train.py", "backward")
    assert finding.class_ == "sharded-step-divergence"
    assert finding.message.startswith(
        f"rank 0 ran 4 backward passes of the sharded `Sequential` (the last at fsdp2_train.py:{backward}), "
        f"rank 1 ran 3 (the last at fsdp2_train.py:{backward}): every backward of a sharded model"
    ), finding.message
    assert finding.fix is not None and "must still run the backward" in finding.fix.message


def test_clean_ddp_and_fsdp2_training_give_bit_identical_weights(tmp_path: Path) -> None:
    """The same training plain and under `ddpdoctor run`: DDP (its gradient all-reduces in C++) and then FSDP2
    (its all-gathers and reduce-scatters through the Python functions the guard wraps) end with the same
    weights to the bit, and the guard says nothing. One job for both (fixtures/ddp_train.py)."""
    plain = tmp_path / "plain.pt"
    guarded_weights = tmp_path / "guarded.pt"
    first = run_passing_job(ranks("ddp_train.py", str(plain)), "rank 1: done")
    assert first.returncode == 0, first.output[-3000:]
    second = run_passing_job(
        guarded(*ranks("ddp_train.py", str(guarded_weights)), report=tmp_path / "report"), "rank 1: done"
    )
    assert second.returncode == 0, second.output[-3000:]
    assert report_of(tmp_path / "report") == [] and "ddpdoctor:" not in second.output, second.output[-3000:]
    losses = sorted(re.findall(r"rank \d: fsdp2 loss [0-9.]+", first.output))
    assert len(losses) == 2 and sorted(re.findall(r"rank \d: fsdp2 loss [0-9.]+", second.output)) == losses
    a, b = torch.load(plain), torch.load(guarded_weights)
    assert a.keys() == b.keys() and {k.split(".")[0] for k in a} == {"ddp", "fsdp2"}
    assert all(torch.equal(a[k], b[k]) for k in a)


def assert_no_store_noise(output: str) -> None:
    """Under Lightning's launcher and mp.spawn rank 0 hosts the store: if it left while the judge still
    counted acknowledgements, torch printed a "Connection reset by peer" C++ stack trace under the report."""
    assert "Connection reset by peer" not in output, output[-3000:]


def test_mp_spawn_children_are_guarded(tmp_path: Path) -> None:
    result = run_job(guarded(PYTHON, "spawned.py", "broken", report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.message.startswith("op mismatch: rank 0 all_reduce(SUM) [2] float32 vs rank 1 barrier")
    assert_no_store_noise(result.output)


def test_a_clean_job_whose_store_host_leaves_first_prints_nothing() -> None:
    """mp.spawn without destroy_process_group: rank 0 hosts the store and finishes first. The other
    rank's monitor must let go of the store before it is gone, not fail on it (a torch C++ stack trace
    and a guard warning on a clean job)."""
    result = run_passing_job(guarded(PYTHON, "spawned.py", "no-destroy"), timeout=60)
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 1: done" in result.output
    assert "ddpdoctor" not in result.output and "TCPStore" not in result.output, result.output[-3000:]


@pytest.mark.slow
def test_mp_spawn_fixed_form_is_clean() -> None:
    fixed = run_passing_job(guarded(PYTHON, "spawned.py", "fixed"), timeout=60)
    assert fixed.returncode == 0, fixed.output[-3000:]
    assert "ddpdoctor:" not in fixed.output


def test_lightning_is_global_zero_sync_dist_hang_names_the_logged_metric(tmp_path: Path) -> None:
    result = run_job(guarded(PYTHON, "lightning_sync.py", "broken", report=tmp_path), timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "collective-divergence"
    assert "metric `val_metric`, logged with sync_dist=True at" in finding.message
    line = fixture_line("lightning_sync.py", "global zero only")
    assert f"lightning_sync.py:{line} in on_validation_epoch_end" in finding.message
    assert finding.locations[0].path.endswith("lightning_sync.py") and finding.locations[0].line == line
    assert_no_store_noise(result.output)


@pytest.fixture(scope="module")
def lightning_fixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, Path]:
    """The fixed Lightning job whose rank 1 outlives the main process (it post-processes for 7 s): one run
    for the test that it is clean and the test that rank 1 is not cut short."""
    report = tmp_path_factory.mktemp("lightning-fixed")
    result = run_passing_job(
        guarded(PYTHON, "lightning_sync.py", "fixed", "slow-rank-1", report=report), timeout=90
    )
    return result, report


def test_lightning_fixed_form_is_clean(lightning_fixed: tuple[JobResult, Path]) -> None:
    result, report = lightning_fixed
    assert result.returncode == 0, result.output[-3000:]
    assert report_of(report) == []


def test_store_vanishing_mid_run_disables_the_guard_and_training_goes_on(tmp_path: Path) -> None:
    import subprocess

    port = free_port()
    server = subprocess.Popen(
        [PYTHON, "-c", "import datetime,time,torch.distributed as d;"
         f"s=d.TCPStore('127.0.0.1',{port},2,True,timeout=datetime.timedelta(seconds=60));time.sleep(120)"],
        start_new_session=True,
    )
    marker = str(tmp_path / "mark")
    rank_procs = [
        subprocess.Popen([PYTHON, str(FIXTURES / "store_vanishes.py"), str(r), str(port), marker],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(),
                         start_new_session=True)
        for r in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 40
        while not all(Path(f"{marker}.{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "ranks never started"
            assert all(p.poll() is None for p in rank_procs)
            time.sleep(0.1)
        server.kill()
        server.wait(10)
        Path(f"{marker}.killed").touch()
        outputs = [p.communicate(timeout=40)[0] for p in rank_procs]
    finally:
        import os
        import signal

        for proc in (server, *rank_procs):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for rank, (proc, output) in enumerate(zip(rank_procs, outputs, strict=True)):
        assert proc.returncode == 0, output[-3000:]
        assert f"rank {rank}: done" in output
        assert output.count("[ddpdoctor] warning: the guard disabled itself") == 1, output[-3000:]


def test_eight_ranks_one_skips_a_collective(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_job(guarded(*ranks("eight_ranks.py", nproc=8), report=tmp_path), timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "collective-divergence"
    assert "rank 5 barrier" in finding.message and "all_reduce(SUM) [16] float32" in finding.message
    assert len(finding.facts["ranks"]) == 8
    assert result.output.count("ddpdoctor: collective-divergence") == 1
    assert time.monotonic() - started < 80


def test_install_inside_spawned_workers_without_the_launcher(tmp_path: Path) -> None:
    result = run_job([PYTHON, "install_in_workers.py", "broken", str(tmp_path)], timeout=60)
    assert result.returncode != 0
    assert result.output.count("ddpdoctor: collective-divergence") == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    # a worker that returned is "exited" (it skipped the collective), not "dead"
    assert "but rank 1 finished without calling it" in finding.message
    assert (tmp_path / "job-1" / "rank-0.jsonl").exists() and (tmp_path / "job-1" / "rank-1.jsonl").exists()
    # fixed, and run again into the same directory: the broken run's report must not stand for this one
    fixed = run_passing_job([PYTHON, "install_in_workers.py", "fixed", str(tmp_path)], timeout=60)
    assert fixed.returncode == 0, fixed.output[-3000:]
    assert report_of(tmp_path) == []
    [job] = tmp_path.glob("job-*")  # the broken run's folder went with its logs
    for rank in (0, 1):
        records = [json.loads(line) for line in (job / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert [r["state"] for r in records] == ["done"]


def test_findings_of_install_are_in_the_report_though_rank_0_is_killed(tmp_path: Path) -> None:
    """install() on its own has no launcher to gather the ranks' findings: rank 0 writes report.json at exit.
    A rank 0 SIGKILLed before its exit (Lightning's launcher does it when another rank dies first) must
    not take the findings already made with it."""
    result = run_job([PYTHON, "install_in_workers.py", "killed", str(tmp_path)], timeout=60)
    assert "rank 0: DDP refused the model" in result.output, result.output[-3000:]
    assert result.returncode != 0
    [finding] = [f for f in report_of(tmp_path) if f.class_ == "foreign-device-hooks"]
    assert finding.facts["wrapped_by"] == "DistributedDataParallel"
    assert finding.facts["device"] == "meta"


@DEMO_LANE
def test_lightning_metric_is_named_even_when_the_verdict_needs_no_stack(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """examples/collective-divergence/lightning_broken.py: rank 0 waits in the barrier of Lightning's metric
    sync while rank 1 is already in the next epoch's broadcast. The op mismatch is decided from the
    fingerprints alone, before any rank publishes its stack; the metric must still be named, from the
    fingerprint Lightning's collective left when it was entered. The demo runs this script under
    `ddpdoctor run`: its run is read where this session made it (a Lightning job less), else made here."""
    [run] = [r for r in RUNS if r.id == "collective-divergence/lightning_broken"]
    kept = demo_kept_runs(request)
    done = kept_run(kept, run, guarded=True) if kept else None
    if done is not None:
        returncode, output, report = done[0].returncode, done[0].output, done[1] / "report"
    else:
        result = run_job(guarded(PYTHON, str(run.script), report=tmp_path), timeout=90, cwd=str(tmp_path),
                         env=job_env(DDPDOCTOR_EXAMPLE_TIMEOUT="30"))
        returncode, output, report = result.returncode, result.output, tmp_path
    assert returncode == 1, output[-3000:]
    finding = report_of(report)[0]
    assert finding.class_ == "collective-divergence"
    assert "metric `val_metric`, logged with sync_dist=True at" in finding.message
    assert "lightning_broken.py:40 in on_validation_epoch_end" in finding.message
    rank0 = [loc for loc in finding.locations if loc.rank == 0]
    assert rank0 and rank0[0].path.endswith("lightning_broken.py") and rank0[0].line == 40
    assert_no_store_noise(output)


def test_backend_device_mismatch_inside_lightning_names_library_metric_and_user_line(tmp_path: Path) -> None:
    """F1 issued by a library long after the user's call: Lightning's `_sync_ddp` syncs a metric logged with
    sync_dist=True over a group with a backend for cuda only. The report must name the library frame, the
    metric and the `self.log` line, not only torch's internals."""
    # The script that generated explain's fixture log of the same failure (tests/explain/fixtures/generate).
    script = FIXTURES.parents[1] / "explain" / "fixtures" / "generate" / "lightning_f1_sync_dist.py"
    result = run_job(guarded(PYTHON, str(script), report=tmp_path), timeout=90, cwd=str(tmp_path))
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "backend-device-mismatch", result.output[-3000:]
    assert "has backends only for cuda" in finding.message
    assert "issued by lightning at" in finding.message and "in _sync_ddp" in finding.message
    assert "for metric `train_loss`, logged with sync_dist=True at" in finding.message
    assert finding.facts["library"] == "lightning" and finding.facts["metric"] == "train_loss"
    user = finding.locations[0]
    assert user.path.endswith("lightning_f1_sync_dist.py") and user.line == 23
    assert any(loc.path.endswith("lightning/fabric/utilities/distributed.py") for loc in finding.locations)


@pytest.fixture(scope="module")
def p2p_then_equivalent(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, Path]:
    """point_to_point.py `clean`, then equivalent_arguments.py's calls, in one 3-rank job (both end cleanly):
    one run for the two tests that read it, where a job each cost the suite a 3-rank run more."""
    report = tmp_path_factory.mktemp("p2p-then-equivalent")
    result = run_passing_job(
        guarded(*ranks("point_to_point.py", "clean", "equivalent-arguments", nproc=3), report=report),
        timeout=90,
    )
    return result, report


def test_point_to_point_ops_and_monitored_barrier_keep_the_ranks_aligned(
    p2p_then_equivalent: tuple[JobResult, Path],
) -> None:
    """gloo counts a send or recv only on the ranks involved: the later collectives must still be matched
    rank to rank, with no report while rank 0 is merely late."""
    result, report = p2p_then_equivalent
    assert result.returncode == 0, result.output[-3000:]
    assert report_of(report) == [] and "ddpdoctor:" not in result.output
    assert all(f"rank {rank}: done" in result.output for rank in range(3)), result.output[-3000:]


def test_after_point_to_point_ops_a_skipped_collective_is_named(tmp_path: Path) -> None:
    result = run_job(
        guarded(*ranks("point_to_point.py", "p2p-then-skip", nproc=3), report=tmp_path), timeout=90
    )
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    line = fixture_line("point_to_point.py", "skipped by rank 2")
    assert (
        f"in all_reduce(SUM) [4] float32 at point_to_point.py:{line} (collective #3 of group 0)"
        in finding.message
    )
    assert "rank 2 is running, not in a collective" in finding.message, finding.message


@pytest.fixture(scope="module")
def caught_errors(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, Path]:
    """collectives.py `caught-error`, `caught-bad-root`, then `loader-workers` (loader_workers.py's forked
    DataLoader epochs) in one 2-rank job (all end cleanly): one run for the three tests that read it, where a
    job each cost the suite ~10 CPU-s more. Each asserts its own part of the output; the empty report is
    each's."""
    report = tmp_path_factory.mktemp("caught-errors")
    result = run_passing_job(
        guarded(*ranks("collectives.py", "caught-error,caught-bad-root,loader-workers"), report=report),
        timeout=90,
    )
    return result, report


# what caught-bad-root prints; caught-error's lines are the other `caught` lines
BAD_ROOT = re.compile(r"rank 0: caught .*invalid root rank.* \((\d+\.\d) s\)")


def test_an_error_every_rank_caught_in_the_same_collective_is_not_a_divergence(
    caught_errors: tuple[JobResult, Path],
) -> None:
    result, report = caught_errors
    assert result.returncode == 0, result.output[-3000:]
    # every `caught` in the output but caught-bad-root's line: one per rank
    assert result.output.count("caught") - len(BAD_ROOT.findall(result.output)) == 2, result.output[-3000:]
    assert "rank 1: done" in result.output
    assert report_of(report) == []


def test_a_divergence_after_a_caught_collective_error_is_still_reported(tmp_path: Path) -> None:
    """The post-mortem of the caught error decides nothing and stops the monitor; the next collective
    must bring it back, or the divergence that follows hangs until the backend's timeout."""
    result = run_job(guarded(*ranks("collectives.py", "caught-then-diverge"), report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    line = fixture_line("collectives.py", "caught-then-diverge")
    assert finding.message.startswith(
        "op mismatch: rank 0 all_reduce(SUM) [4] float32 vs rank 1 broadcast(root=0)"
    )
    assert f"collectives.py:{line}" in finding.message, finding.message



def test_the_same_collective_spelled_differently_on_each_rank_is_not_a_divergence(
    p2p_then_equivalent: tuple[JobResult, Path],
) -> None:
    """A ReduceOp object (its str() holds an address) and a root given as src= on one rank and as
    group_src= on another are the same call to the backend: the job must run to its end, unreported. Its
    calls run after point_to_point.py's clean ones, in one job (the `p2p_then_equivalent` fixture)."""
    result, report = p2p_then_equivalent
    assert result.returncode == 0, result.output[-3000:]
    assert "ddpdoctor:" not in result.output, result.output[-3000:]
    assert all(f"rank {rank}: equivalent done" in result.output for rank in range(3)), result.output[-3000:]
    assert report_of(report) == []
    records = [json.loads(line) for line in (report / "job-1" / "rank-2.jsonl").read_text().splitlines()]
    roots = [(r["op"], r["root"]) for r in records if r["op"] in ("gather", "broadcast", "reduce")]
    # an omitted root is global rank 0; group ranks are named by their global ranks
    assert roots == [("gather", 0)] * 3 + [("broadcast", 1), ("reduce", 2)]
    assert {r["reduce_op"] for r in records if r["op"] == "all_reduce"} == {"SUM"}


def test_an_argument_error_caught_on_one_rank_is_not_a_divergence(
    caught_errors: tuple[JobResult, Path],
) -> None:
    """gloo refuses `src=7` on the rank that passes it, before the call takes a sequence number: no peer
    waits for it, so it is no backend failure to judge (which took 3 s and killed the job). Run after
    caught-error in one job (the `caught_errors` fixture)."""
    result, report = caught_errors
    assert result.returncode == 0, result.output[-3000:]
    assert report_of(report) == []
    caught = BAD_ROOT.search(result.output)
    assert caught, result.output[-3000:]
    assert float(caught.group(1)) < 1.0


def test_a_second_default_group_is_judged_by_itself(tmp_path: Path) -> None:
    """destroy_process_group() and a new init_process_group(): the old group's backends, sequence numbers
    and store keys must not carry over (a CPU tensor refused as on the old cuda-only group; no report of a
    hang in the new group until the backend's own timeout)."""
    clean = run_passing_job(
        guarded(*ranks("second_group.py", "clean"), report=tmp_path / "clean"), timeout=60
    )
    assert clean.returncode == 0, clean.output[-3000:]
    assert (
        "ddpdoctor:" not in clean.output and "rank 1: done [1024.0, 1024.0, 1024.0, 1024.0]" in clean.output
    )
    started = time.monotonic()
    result = run_job(
        guarded(*ranks("second_group.py", "elsewhere"), report=tmp_path / "hang", hang_after=3), timeout=60
    )
    assert result.returncode == 1, result.output[-3000:]
    # long before the group's timeout (torch's default, 30 min); generous: start-up is slow under load
    assert time.monotonic() - started < 55
    finding = report_of(tmp_path / "hang")[0]
    line = fixture_line("second_group.py", "second group")
    assert (
        f"rank 0 has waited 3 s in all_reduce(SUM) [4] float32 at second_group.py:{line}" in finding.message
    ), finding.message
    elsewhere = fixture_line("second_group.py", "elsewhere")
    assert (
        f"rank 1 is running, not in a collective (at second_group.py:{elsewhere} in <module>)"
        in finding.message
    )


@pytest.fixture(scope="module")
def passed_early(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    """passed_early.py `stay` then `then-exit` in one 3-rank job (both end cleanly; then-exit last, where rank
    1 leaves without another collective): one run for both cases below, where a job each cost the suite a
    3-rank run more."""
    report = tmp_path_factory.mktemp("passed-early")
    return run_passing_job(
        guarded(*ranks("passed_early.py", "stay,then-exit", nproc=3), report=report, hang_after=10),
        timeout=90,
    )


@pytest.mark.parametrize("mode", ["stay", "then-exit"])
def test_a_peer_that_made_the_call_long_ago_is_not_blamed(passed_early: JobResult, mode: str) -> None:
    """Rank 1 did its part of the gather and then 20 collectives on another group; its last records no
    longer show the gather, but it made it from Python: not "a collective issued outside Python", not
    "finished without calling it"."""
    result = passed_early
    assert result.returncode == 0, result.output[-3000:]
    assert "ddpdoctor:" not in result.output
    assert all(f"rank {rank}: {mode} done" in result.output for rank in range(3)), result.output[-3000:]
    assert all(f"rank {rank}: done" in result.output for rank in range(3))


def test_every_rank_dying_of_the_same_error_in_the_same_call_is_left_to_its_traceback(tmp_path: Path) -> None:
    """Each rank raised gloo's own error about the splits it was given: the tracebacks say what happened.
    Before, the rank torchrun stopped second was named the dead rank the other waited for."""
    result = run_job(guarded(*ranks("collectives.py", "inconsistent-splits"), report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    assert "ddpdoctor:" not in result.output, result.output[-3000:]
    assert "inLengthPerRank" in result.output
    assert report_of(tmp_path) == []


def test_another_threads_collectives_do_not_hide_the_main_threads_wait(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_job(guarded(*ranks("side_thread.py"), report=tmp_path, hang_after=3), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    # long before the group's timeout (torch's default, 30 min); generous: start-up is slow under load
    assert time.monotonic() - started < 55
    finding = report_of(tmp_path)[0]
    line = fixture_line("side_thread.py", "main thread waits")
    # waited --hang-after (3 s) or a second more: when the judge's heartbeat falls is not the test's to fix
    waited = rf"rank 0 has waited [34] s in all_reduce\(SUM\) \[4\] float32 at side_thread\.py:{line}\b"
    assert re.search(waited, finding.message), finding.message


def test_lightning_metric_syncs_that_pair_up_wrongly_are_named_by_metric(tmp_path: Path) -> None:
    """Rank 0's extra `val_rank0_only` sync pairs with rank 1's `train_loss` sync (same op and shape: gloo
    completes them and averages one metric into the other); the report must name the two metrics and
    the line that logs the extra one, not a later, healthy line."""
    result = run_job(guarded(PYTHON, "lightning_sync.py", "swapped", report=tmp_path), timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    line = fixture_line("lightning_sync.py", "rank 0 only")
    assert finding.message.startswith("metric mismatch"), finding.message
    assert (
        f"metric `val_rank0_only`, logged with sync_dist=True at lightning_sync.py:{line}" in finding.message
    )
    assert "metric `train_loss`" in finding.message


def test_a_metric_name_logged_from_two_hooks_is_named_by_the_hook_that_hangs(tmp_path: Path) -> None:
    result = run_job(guarded(PYTHON, "lightning_sync.py", "same-name", report=tmp_path), timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    line = fixture_line("lightning_sync.py", "training loss")
    assert (
        f"metric `loss`, logged with sync_dist=True at lightning_sync.py:{line} in training_step"
        in finding.message
    ), finding.message


def test_forked_dataloader_workers_of_a_guarded_rank_print_nothing(
    caught_errors: tuple[JobResult, Path],
) -> None:
    """loader_workers.py's epochs, run by collectives.py's `loader-workers` mode after its caught errors (the
    `caught_errors` fixture: one job)."""
    result, report = caught_errors
    assert result.returncode == 0, result.output[-3000:]
    assert "Exception ignored" not in result.output and "Traceback" not in result.output, result.output[
        -3000:
    ]
    assert all(f"rank {rank}: loader workers done" in result.output for rank in (0, 1)), result.output[-3000:]
    assert "rank 1: done" in result.output
    assert report_of(report) == []


@pytest.mark.parametrize("launch", ["torchrun", "mp.spawn"])
def test_a_rank_dying_of_an_uncaught_exception_is_named_dead_of_it(tmp_path: Path, launch: str) -> None:
    """Not "finished without calling it": the rank's interpreter exit ran after its excepthook (torchrun),
    or mp.spawn's wrapper caught the exception and exited 1; the error is what the report must name,
    with the line that raised."""
    script = "collectives.py" if launch == "torchrun" else "spawned.py"
    command = torchrun(script, "raises") if launch == "torchrun" else (PYTHON, script, "raises")
    result = run_job(guarded(*command, report=tmp_path), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert finding.class_ == "dead-rank", finding.message
    line = fixture_line(script, "raises")
    assert re.match(
        rf"rank 1 died \(ValueError: boom\) at {script}:{line} in \S+ while rank 0 waits in all_reduce",
        finding.message,
    ), finding.message
    assert (finding.locations[0].rank, finding.locations[0].line) == (1, line)
    stack = finding.facts["ranks"]["1"]["stack"]
    assert stack and stack[0][0].endswith(script) and stack[0][1] == line


def test_report_command_shows_every_recorded_call_of_a_real_run_with_its_group_and_line(
    tmp_path: Path,
) -> None:
    """`ddpdoctor report` on what a guarded run wrote: two groups count their sequence numbers apart, and
    every cell names its call site (the rank files' own format, not a hand-written one)."""
    result = run_job(guarded(*ranks("two_groups.py"), report=tmp_path / "run"), timeout=60)
    assert result.returncode == 1, result.output[-3000:]
    logs = tmp_path / "run" / "job-1"
    recorded = sum(len((logs / f"rank-{r}.jsonl").read_text().splitlines()) for r in (0, 1))
    html = tmp_path / "run.html"
    shown = run_job([*DDPDOCTOR, "report", str(tmp_path / "run"), "--html", str(html)], timeout=60)
    assert shown.returncode == 1, shown.output  # the run had findings
    page = html.read_text()
    assert page.count('class="call') == recorded
    line = fixture_line("two_groups.py", "diverges")
    assert f"called at: {FIXTURES / 'two_groups.py'}:{line}" in page.replace("&#x27;", "'")
    assert page.count('<th class="divergent"') == 1 and "group 1" in page
    text = run_job([*DDPDOCTOR, "report", str(tmp_path / "run")], timeout=60)
    assert f"two_groups.py:{line}" in text.output


def test_a_stopped_rank_is_named_not_responding_and_the_job_ends_soon_after_the_report(
    tmp_path: Path,
) -> None:
    """A SIGSTOPped rank cannot answer torchrun's SIGTERM: without ddpdoctor stopping it, the job stayed
    up for torchrun's 30 s escalation after the report."""
    # timed from the report (report.json appears) to the end of the job, not from its start: start-up is
    # slow under load, and the wait this test is about is torchrun's 30 s escalation after the report
    reported: list[float] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set() and not (tmp_path / "report.json").exists():
            time.sleep(0.1)
        reported.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = run_job(
        guarded(*torchrun("collectives.py", "stopped"), report=tmp_path, hang_after=3), timeout=90
    )
    ended = time.monotonic()
    watching.set()
    watcher.join(timeout=5)
    assert result.returncode == 1, result.output[-3000:]
    finding = report_of(tmp_path)[0]
    assert "rank 1 is not responding (no heartbeat for" in finding.message, finding.message
    assert "its process is stopped" in finding.message
    assert ended - reported[0] < 20, f"the job ended {ended - reported[0]:.0f} s after the report"
    pid = int(re.search(r"rank 1: pid (\d+)", result.output).group(1))
    assert not pid_alive(pid)


def test_a_lightning_rank_that_outlives_the_main_process_is_not_cut_short(
    lightning_fixed: tuple[JobResult, Path],
) -> None:
    """Under Lightning's launcher rank 0 is the main process; rank 1, its child, may finish its own work
    later, as it does without ddpdoctor."""
    result, _ = lightning_fixed
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 1: post-processing done" in result.output, result.output[-3000:]
