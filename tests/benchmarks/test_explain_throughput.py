"""benchmarks/explain_throughput.py: a small run in the suite (it must keep working and diagnose its own
log); the 1 GB run that the closing numbers come from is `-m slow`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "explain_throughput.py"


def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


def test_small_run_reports_speed_memory_and_the_diagnosis():
    done = run("--size", "20M", timeout=120)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"\d+\.\d MB/s", out) and "peak RSS" in out, out
    assert "-> collective-timeout, silent ranks [1]" in out
    assert "peak memory growth from" in out


@pytest.mark.slow
def test_one_gigabyte_meets_the_target_with_flat_memory():
    done = run(timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "target (>= 20 MB/s, memory independent of size): met" in done.stdout
