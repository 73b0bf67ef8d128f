"""benchmarks/guard_overhead.py --quick runs and prints every number the issue asks for (`-m slow`: two
minutes of 2-rank jobs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "guard_overhead.py"


@pytest.mark.slow
def test_quick_run_prints_overhead_detail_comparison_step_and_detection_time():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for size in ("1", "4096", "262144", "4194304"):
        assert f"all_reduce {size} fp32" in out
    assert "DETAIL/no guard" in out and "ddp_step" in out and "stand-in CPU" in out
    assert (
        "guard hot path alone" in out
        and "from a 300-line function" in out
        and "DDP training step: wall" in out
    )
    assert (
        "right after 16 MB went through a socket" in out and "stand-in" in out.split("16 MB went through")[1]
    )
    assert "divergence decidable -> report written:" in out
