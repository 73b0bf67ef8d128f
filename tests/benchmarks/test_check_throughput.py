"""benchmarks/check_throughput.py runs and reports what the issue asks for (the full run is `-m slow`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "check_throughput.py"


def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


def test_quick_run_reports_lines_speed_and_ratio_to_pyflakes():
    done = run("--limit", "40", "--jobs", "0", timeout=120)
    out = done.stdout
    assert "files:      40" in out
    for label in ("lines:", "ddpdoctor:", "kLOC/s per core", "pyflakes:", "ratio:", "target:"):
        assert label in out, out
    assert done.returncode in (0, 1)  # 1 only if a tiny sample is below target


@pytest.mark.slow
def test_full_run_meets_the_target():
    done = run(timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "target:     >= 40 kLOC/s per core: met" in done.stdout
