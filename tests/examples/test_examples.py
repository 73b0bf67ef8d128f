"""Every example does what its example.toml (and the catalogue) says: broken fails that way, fixed passes.

The runs are real: torchrun with 2 gloo ranks on the CPU, Lightning's own DDP launcher. They are started two
at a time in the background (the machine has 2 cores) as soon as the first test asks, and each test waits for
its own run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from demo_runs import demo_kept_runs

from ddpdoctor.catalogue import CATALOGUE
from ddpdoctor.demo.manifest import (
    EXAMPLES,
    ExampleRun,
    ManifestError,
    RunResult,
    all_examples,
    cuda_device_count,
    load_example,
    run_example,
)
from ddpdoctor.demo.tour import read_run_record, run_folder
from ddpdoctor.explain import explain_paths

ALL = all_examples()
RUNS = {run.id: run for example in ALL for run in example.runs}
CUDA = cuda_device_count()


def test_every_catalogue_class_has_an_example():
    assert sorted(e.slug for e in ALL) == sorted(c.slug for c in CATALOGUE)


@pytest.mark.parametrize("example", ALL, ids=lambda e: e.slug)
def test_example_folder_is_complete(example):
    for name in ("broken.py", "fixed.py", "README.md"):
        assert (example.folder / name).is_file(), f"{example.slug} lacks {name}"
    scripts = {run.script.name for run in example.runs}
    assert {"broken.py", "fixed.py"} <= scripts
    # A broken script must be shown failing somewhere: on this CPU machine, or on GPUs.
    assert (
        any(run.expect == "fail" for run in example.runs if run.script.name == "broken.py")
        or example.needs_gpu
    )
    if example.needs_gpu:
        # GPU-only classes still run their CPU part here.
        assert any(run.device == "cpu" for run in example.runs)
    readme = (example.folder / "README.md").read_text()
    assert "broken.py" in readme and "fixed.py" in readme


def test_manifest_errors_are_reported(tmp_path):
    folder = tmp_path / "dead-rank"
    folder.mkdir()
    (folder / "broken.py").write_text("")
    (folder / "example.toml").write_text(
        'class = "dead-rank"\n[[run]]\nscript = "broken.py"\nexpect = "maybe"\n'
    )
    with pytest.raises(ValueError, match="bad launcher/device/expect"):
        load_example(folder)
    (folder / "example.toml").write_text('class = "other"\n[[run]]\nscript = "broken.py"\n')
    with pytest.raises(ValueError, match="folder name"):
        load_example(folder)
    (folder / "example.toml").write_text(
        'class = "dead-rank"\n[[run]]\nscript = "broken.py"\nlauncher = "python"\nexpect = "fail"\n'
        'output = "x"\nguard = "no-such-class"\n'
    )
    with pytest.raises(ManifestError, match="class slug"):
        load_example(folder)


@pytest.fixture(scope="session")
def started_runs(request, tmp_path_factory) -> dict[str, Future[RunResult]]:
    wanted = [
        item.callspec.params["run_id"]
        for item in request.session.items
        if getattr(item, "callspec", None) is not None and "run_id" in item.callspec.params
    ]
    # every run the session's demo made (each broken script plain, each fixed one plain or guarded:
    # `_kept_run`) is read from there rather than made again (all but the GPU-only classes' CPU parts)
    kept = demo_kept_runs(request)
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="example")
    futures: dict[str, Future[RunResult]] = {}
    # In the order the tests will ask, so that each test waits for little more than its own run.
    for run_id in dict.fromkeys(wanted):
        run = RUNS[run_id]
        if not run.runnable_here(CUDA):
            continue
        done = _kept_run(kept, run) if kept else None
        if done is not None:
            futures[run_id] = Future()
            futures[run_id].set_result(done)
            continue
        cwd = tmp_path_factory.mktemp(run_id.replace("/", "-"))
        futures[run_id] = pool.submit(run_example, run, cwd)
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def _kept_run(kept: Path, run: ExampleRun) -> RunResult | None:
    """The demo's run of this script: its plain run, or, for a fixed script of a class the guard catches
    (which the demo runs under `ddpdoctor run` only, to show the guard silent), its guarded run. That run
    is the same script and the same expectation (exit 0, the manifest's output) through a second door;
    making the 11 of them again here cost the suite a minute and a half."""
    done = read_run_record(run_folder(kept, run, guarded=False), run)
    if done is None and run.expect == "pass":
        done = read_run_record(run_folder(kept, run, guarded=True), run)
    return done


@pytest.mark.parametrize("run_id", sorted(RUNS))
def test_example_runs_as_documented(run_id, started_runs):
    run = RUNS[run_id]
    if not run.runnable_here(CUDA):
        pytest.skip(
            f"needs {run.gpus} CUDA device(s)" if run.device == "cuda" else "CPU part (a GPU is present)"
        )
    result = started_runs[run_id].result(timeout=run.timeout * 3)
    problems = result.problems()
    assert not problems, f"{run_id}: {'; '.join(problems)}\n--- output (tail) ---\n{result.output[-4000:]}"


EXPLAINED = sorted(run_id for run_id, run in RUNS.items() if run.explain)


@pytest.mark.parametrize("run_id", EXPLAINED)
def test_explain_names_the_documented_class_from_the_real_log(run_id, started_runs, tmp_path):
    """What `ddpdoctor demo` shows: the log of the broken run, read by `explain`, gives the manifest's
    class."""
    run = RUNS[run_id]
    if run_id not in started_runs:
        pytest.skip("not runnable on this machine")
    log = tmp_path / "log.txt"
    log.write_text(started_runs[run_id].result(timeout=run.timeout * 3).output)
    diagnoses = explain_paths([str(log)]).diagnoses
    assert diagnoses, f"{run_id}: explain found nothing"
    assert diagnoses[0].slug == run.explain, [d.slug for d in diagnoses]


# Examples whose `check` expectation the checker does not meet yet. Strict: when the checker learns to catch
# one, its xfail turns into a failure here, and the entry must go.
CHECKER_GAPS: dict[str, str] = {}
CHECKED = sorted(run_id for run_id, run in RUNS.items() if run.check is not None)


@pytest.fixture(scope="module")
def check_codes() -> dict[str, set[str]]:
    """One real `ddpdoctor check examples --format json` run: rule codes found, per file."""
    done = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "check", str(EXAMPLES), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=EXAMPLES.parent,
    )
    assert done.returncode in (0, 1), done.stderr
    data = json.loads(done.stdout)
    findings = data["findings"] if isinstance(data, dict) else data
    codes: dict[str, set[str]] = {}
    for finding in findings:
        path = (EXAMPLES.parent / finding["locations"][0]["path"]).resolve()
        codes.setdefault(str(path), set()).add(finding["code"])
    return codes


@pytest.mark.parametrize(
    "run_id",
    [pytest.param(r, marks=pytest.mark.xfail(reason=CHECKER_GAPS[r], strict=True)) if r in CHECKER_GAPS else r
     for r in CHECKED],
)
def test_check_reports_what_the_manifest_says(run_id, check_codes):
    run = RUNS[run_id]
    assert check_codes.get(str(run.script.resolve()), set()) == set(run.check)


def test_examples_readme_documents_the_manifest():
    text = (EXAMPLES / "README.md").read_text()
    for key in (
        "script",
        "launcher",
        "nproc",
        "device",
        "gpus",
        "expect",
        "output",
        "timeout",
        "env",
        "check",
        "guard",
        "explain",
    ):
        assert f"`{key}`" in text, key


def test_a_hanging_example_is_killed_with_everything_it_started(tmp_path):
    folder = tmp_path / "dead-rank"
    folder.mkdir()
    (folder / "hang.py").write_text(
        "import pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "pathlib.Path('child.pid').write_text(str(child.pid))\n"
        "print('waiting forever', flush=True)\n"
        "time.sleep(600)\n"
    )
    (folder / "example.toml").write_text(
        'class = "dead-rank"\n[[run]]\nscript = "hang.py"\nlauncher = "python"\nexpect = "pass"\n'
        "output = 'waiting forever'\ntimeout = 3\n"
    )
    run = load_example(folder).runs[0]
    result = run_example(run, tmp_path)
    assert result.returncode is None
    assert result.problems() == ["still running after 3s (killed)"]
    assert "waiting forever" in result.output
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the example's own child process survived the kill"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as gone: it has exited and only waits for its (dead) parent to be reaped.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_pass_run_that_only_aborts_in_torchs_exit_cleanup_is_run_once_more(tmp_path):
    folder = tmp_path / "dead-rank"
    folder.mkdir()
    # First run: the proof line, then torch's exit-time abort; second run: clean.
    (folder / "flaky.py").write_text(
        "import os, pathlib, sys\n"
        "print('rank 1: step 4 done', flush=True)\n"
        "mark = pathlib.Path('ran-once')\n"
        "if not mark.exists():\n"
        "    mark.write_text('x')\n"
        "    print('terminate called without an active exception', file=sys.stderr, flush=True)\n"
        "    os.abort()\n"
    )
    (folder / "broken.py").write_text(
        "import os, sys\nprint('terminate called without an active exception', flush=True)\nos.abort()\n"
    )
    (folder / "example.toml").write_text(
        'class = "dead-rank"\n'
        '[[run]]\nscript = "flaky.py"\nlauncher = "python"\nexpect = "pass"\noutput = "step 4 done"\n'
        '[[run]]\nscript = "broken.py"\nlauncher = "python"\nexpect = "pass"\noutput = "step 4 done"\n'
    )
    flaky, broken = load_example(folder).runs
    result = run_example(flaky, tmp_path)
    assert result.rerun and result.returncode == 0 and not result.problems()
    # Without the proof line it is a real failure: reported, not run again.
    result = run_example(broken, tmp_path)
    assert not result.rerun and result.returncode != 0
    assert result.problems() and "expected exit 0" in result.problems()[0]
