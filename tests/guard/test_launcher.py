"""`ddpdoctor run` as a launcher: usage errors, exit codes, and nothing of the job left running."""

from __future__ import annotations

import os
import time
from pathlib import Path

from guard_jobs import DDPDOCTOR, PYTHON, run_job


def test_no_command_is_a_usage_error() -> None:
    result = run_job([*DDPDOCTOR, "run"], timeout=30)
    assert result.returncode == 2
    assert "no command given" in result.output and "Traceback" not in result.output


def test_missing_program_is_one_line() -> None:
    result = run_job([*DDPDOCTOR, "run", "--", "/nonexistent/trainer"], timeout=30)
    assert result.returncode == 2
    assert "cannot start '/nonexistent/trainer'" in result.output and "Traceback" not in result.output


def test_exit_code_of_a_command_without_findings_is_passed_through() -> None:
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-c", "import sys; sys.exit(3)"], timeout=30)
    assert result.returncode == 3


def test_arguments_after_the_separator_are_passed_unchanged() -> None:
    code = "import sys; print(sys.argv[1:])"
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-c", code, "--report", "x y", "--"], timeout=30)
    assert result.returncode == 0
    assert "['--report', 'x y', '--']" in result.output


def test_background_children_do_not_outlive_the_job(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "sys.exit(1)\n"
    )
    result = run_job([*DDPDOCTOR, "run", "--", PYTHON, "-c", code], timeout=60)
    assert result.returncode == 1
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"child {pid} of the job is still running")
