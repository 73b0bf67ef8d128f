"""Helpers for the guard's multi-process tests: every job runs in its own process group, with a free
port and a timeout, and the whole group is killed afterwards whatever happened."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
VENV_BIN = Path(sys.executable).parent
PYTHON = sys.executable
TORCHRUN = str(VENV_BIN / "torchrun")
DDPDOCTOR = [PYTHON, "-m", "ddpdoctor"]


@dataclass
class JobResult:
    returncode: int
    output: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "MASTER_", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(extra)
    return env


def run_job(command: list[str], *, timeout: float = 60, env: dict[str, str] | None = None, cwd: str | None = None) -> JobResult:
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env or job_env(),
        cwd=cwd or str(FIXTURES),
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"job did not finish within {timeout} s: {command}\n{output[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return JobResult(proc.returncode, output)


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


def guarded(*command: str, hang_after: float = 4, report: str | Path | None = None, remedy: bool = False) -> list[str]:
    out = [*DDPDOCTOR, "run", "--hang-after", str(hang_after)]
    if report is not None:
        out += ["--report", str(report)]
    if remedy:
        out.append("--remedy")
    return [*out, "--", *command]
