"""Other projects' distributed test suites, plain and guarded (`-m slow`: tens of minutes of 2-rank jobs):
benchmarks/peer_suites.py exits 1 on any change of result or any finding in a correct program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_suites.py"
JOB_COST = Path(__file__).resolve().parents[2] / "benchmarks" / "job_start_exit.py"


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["torch", "accelerate"])
def test_a_peer_suite_gives_the_same_results_guarded_and_no_finding_on_a_correct_program(suite: str) -> None:
    pytest.importorskip("expecttest" if suite == "torch" else "accelerate")
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", suite], capture_output=True, text=True,
                          timeout=5400, start_new_session=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "as expected" in done.stdout


@pytest.mark.slow
def test_a_trivial_job_costs_the_guard_little_outside_its_loop() -> None:
    done = subprocess.run([sys.executable, str(JOB_COST), "--rounds", "3"], capture_output=True, text=True,
                          timeout=1800, start_new_session=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "guarded job over plain" in done.stdout
