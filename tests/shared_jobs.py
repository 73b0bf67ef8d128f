"""Guarded jobs that test modules of several packages read (tests/guard, tests/render): each runs once per
test session, however many tests read it. Their readers are marked with SHARED_JOB_LANE, so that one lane
makes each job once (tests/lanes.py)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import launch_ranks
from ports import free_port
from processes import TOKEN_VARIABLE, run_in_session

SHARED_JOB_LANE = "shared-guard-jobs"
GUARD_FIXTURES = Path(__file__).parent / "guard" / "fixtures"

_scratch = tempfile.mkdtemp(prefix="ddpdoctor-shared-jobs-")
atexit.register(shutil.rmtree, _scratch, ignore_errors=True)


@dataclass(frozen=True)
class ShapeRun:
    returncode: int
    output: str  # what `ddpdoctor run` printed (its report on stderr, merged)
    report: Path  # its --report DIR
    seconds: float  # from start to end of `ddpdoctor run`


@functools.cache
def shape_mismatch_job() -> ShapeRun:
    """`ddpdoctor run --hang-after 4 --report DIR -- <2 gloo ranks> collectives.py shape` (the ranks
    started by tests/launch_ranks.py): rank 0 all_reduces 3 numbers where rank 1 all_reduces 5 (gloo aborts
    rank 0), printed with NO_COLOR in 160 columns. tests/guard/test_run_jobs.py reads its verdict and rank
    logs; tests/render/test_run_report_formats.py its printed panel and its report in every format."""
    report = Path(tempfile.mkdtemp(prefix="collectives-shape-", dir=_scratch)) / "report"
    env = {k: v for k, v in os.environ.items()
           if k == TOKEN_VARIABLE or not k.startswith(("DDPDOCTOR_", "MASTER_", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", NO_COLOR="1", COLUMNS="160")
    command = [sys.executable, "-m", "ddpdoctor", "run", "--hang-after", "4", "--report", str(report), "--",
               *launch_ranks.command(str(GUARD_FIXTURES / "collectives.py"), "shape", port=free_port())]
    started = time.monotonic()
    done = run_in_session(command, timeout=90, env=env, cwd=str(GUARD_FIXTURES), stop_gently=True)
    return ShapeRun(done.returncode, done.stdout, report, time.monotonic() - started)
