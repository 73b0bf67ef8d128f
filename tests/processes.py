"""Running a job under test: in a process session of its own, with a timeout, and the whole session
killed afterwards whatever happened (torchrun's workers and Lightning's DDP children included)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest


def kill_session(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_in_session(
    command: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    merge_stderr: bool = True,
    stop_gently: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `command` to completion; on a timeout fail the test with the output so far. `stop_gently`
    sends SIGTERM first (for a program that must stop its own children, like the demo)."""
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM if stop_gently else signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=15)
        finally:
            kill_session(proc.pid)
        pytest.fail(f"still running after {timeout} s: {command}\n{(out or '')[-4000:]}\n{(err or '')[-3000:]}")
    finally:
        kill_session(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")
