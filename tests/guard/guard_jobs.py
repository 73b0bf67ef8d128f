"""Helpers for the guard's multi-process tests: every job runs in its own process group, with a free
port and a timeout, and the whole group is killed afterwards whatever happened."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import launch_ranks
import shared_jobs
from ports import free_port
from processes import TOKEN_VARIABLE, run_in_session

from ddpdoctor.demo.manifest import TEARDOWN_RERUNS, aborted_in_teardown
from ddpdoctor.findings import Finding, loads

FIXTURES = Path(__file__).parent / "fixtures"
VENV_BIN = Path(sys.executable).parent
PYTHON = sys.executable
TORCHRUN = str(VENV_BIN / "torchrun")
DDPDOCTOR = [PYTHON, "-m", "ddpdoctor"]


@dataclass
class JobResult:
    returncode: int
    output: str


def job_env(**extra: str) -> dict[str, str]:
    # the test's token stays: it is how the leak check finds what the job left running
    env = {k: v for k, v in os.environ.items()
           if k == TOKEN_VARIABLE or not k.startswith(("DDPDOCTOR_", "MASTER_", "TORCHELASTIC"))}
    env.update(
        OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
    )
    env.update(extra)
    return env


def run_job(
    command: list[str], *, timeout: float = 60, env: dict[str, str] | None = None, cwd: str | None = None
) -> JobResult:
    # stop_gently: on a timeout `ddpdoctor run` gets a SIGTERM first, which it passes on before it stops
    # the job's processes; a SIGKILL would leave torchrun (in a session of its own) and its workers behind.
    done = run_in_session(
        command, timeout=timeout, env=env or job_env(), cwd=cwd or str(FIXTURES), stop_gently=True
    )
    return JobResult(done.returncode, done.stdout)


# What the fixtures print once their work is done (a rank's last line)
FINISHED = re.compile(r"rank \d+: (?:done|result|total|loss|fit done)")


def run_passing_job(command: list[str], proof: str | re.Pattern[str] = FINISHED, *, timeout: float = 60,
                    env: dict[str, str] | None = None) -> JobResult:
    """A job that must succeed: run again (a few times at most) if it printed `proof` and then died only of
    torch 2.13's exit-time abort (see ddpdoctor.demo.manifest.TEARDOWN_ABORT; the abort is torch's, a real
    failure repeats). Every test of a job meant to pass runs it through here: one of twenty such jobs
    aborting in teardown failed a whole suite run."""
    result = run_job(command, timeout=timeout, env=env)
    for _ in range(TEARDOWN_RERUNS):
        if not aborted_in_teardown(result.returncode, result.output, proof):
            break
        result = run_job(command, timeout=timeout, env=env)
    return result


def report_of(report_dir: Path) -> list[Finding]:
    """The findings of the report.json a run wrote into its --report directory."""
    return loads((report_dir / "report.json").read_text())


def fixture_line(script: str, marker: str) -> int:
    """The line of a fixture marked with a `# line: <marker>` comment (tests do not hard-code numbers)."""
    lines = (FIXTURES / script).read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if f"# line: {marker}" in text)


def torchrun(script: str, *args: str, nproc: int = 2, port: int | None = None) -> list[str]:
    return [
        TORCHRUN,
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={port or free_port()}",
        str(FIXTURES / script),
        *args,
    ]


def ranks(script: str, *args: str, nproc: int = 2, port: int | None = None) -> list[str]:
    """`torchrun(...)`'s job started by tests/launch_ranks.py, which imports no torch: for the tests whose
    subject is not torchrun (its agent costs a third of a guarded 2-rank job's CPU time)."""
    return launch_ranks.command(str(FIXTURES / script), *args, nproc=nproc, port=port or free_port())


def guarded(
    *command: str, hang_after: float = 4, report: str | Path | None = None, remedy: bool = False
) -> list[str]:
    out = [*DDPDOCTOR, "run", "--hang-after", str(hang_after)]
    if report is not None:
        out += ["--report", str(report)]
    if remedy:
        out.append("--remedy")
    return [*out, "--", *command]


@dataclass(frozen=True)
class SharedRun:
    """A guarded job that tests in several modules read: its result, its --report directory, and how long it
    took (tests that bound the time of the job read it here)."""

    result: JobResult
    report: Path
    seconds: float


_shared_scratch = tempfile.mkdtemp(prefix="ddpdoctor-shared-jobs-")
atexit.register(shutil.rmtree, _shared_scratch, ignore_errors=True)


# The tests that read a job cached here are marked with its lane (xdist_group): one lane makes it once
# (tests/shared_jobs.py holds the jobs read outside tests/guard too, in the same lane)
SHARED_JOB_LANE = shared_jobs.SHARED_JOB_LANE


@functools.cache
def two_clean_torchruns() -> SharedRun:
    """`ddpdoctor run --report DIR -- sh -c "torchrun collectives.py clean && <the same again>"`: two clean
    jobs one after the other on one port, one report directory. tests/guard/test_invisible.py reads both
    jobs' folders (none overwritten); tests/guard/test_run_jobs.py reads the first as the clean job the guard
    leaves alone (a job of its own for that cost the suite a 2-rank run)."""
    report = Path(tempfile.mkdtemp(prefix="two-clean-", dir=_shared_scratch))
    one = shlex.join(torchrun("collectives.py", "clean", port=free_port()))
    started = time.monotonic()
    result = run_passing_job(guarded("sh", "-c", f"{one} && {one}", report=report), timeout=120)
    return SharedRun(result, report, time.monotonic() - started)


DEEP_FOLDER = ("team-project", "experiments", "2026-11-24", "sweep-17", "nested", "checkout")


@dataclass(frozen=True)
class DeepRun:
    """collectives.py `elsewhere` (rank 0 waits in all_reduce, rank 1 sleeps elsewhere; --hang-after 3),
    copied into a deep folder and run from another folder, its stderr redirected to a file and no COLUMNS:
    the printed report where it usually ends up (tests/guard/test_report_output.py), and the report.json
    of a peer busy elsewhere (tests/guard/test_run_jobs.py)."""

    result: JobResult
    script: Path  # the deep copy that ran
    stderr: str  # what the job wrote to its stderr file
    report: Path


@functools.cache
def deep_elsewhere_job() -> DeepRun:
    base = Path(tempfile.mkdtemp(prefix="deep-elsewhere-", dir=_shared_scratch))
    deep = base.joinpath(*DEEP_FOLDER)
    deep.mkdir(parents=True)
    script = deep / "collectives.py"
    shutil.copy(FIXTURES / "collectives.py", script)
    command = guarded(*torchrun("collectives.py", "elsewhere"), hang_after=3, report=base / "report")
    command = [str(script) if part == str(FIXTURES / "collectives.py") else part for part in command]
    stderr = base / "stderr.txt"
    env = {k: v for k, v in job_env().items() if k != "COLUMNS"}
    env["NO_COLOR"] = "1"
    elsewhere = base / "cwd-elsewhere" / "a"  # the paths are absolute in the report, not relative
    elsewhere.mkdir(parents=True)
    result = run_job(["bash", "-c", 'exec "$@" 2>"$0"', str(stderr), *command], env=env, timeout=60,
                     cwd=str(elsewhere))
    return DeepRun(result, script, stderr.read_text(encoding="utf-8"), base / "report")
