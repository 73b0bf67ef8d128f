from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 60, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `ddpdoctor` command as a user would, in a fresh process."""
    full_env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        input=stdin,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def whole_demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`ddpdoctor demo --keep DIR`, the README's main command, run once per session in a session of its own
    (on a timeout it gets SIGTERM, to stop its runs, then SIGKILL). tests/demo reads its output;
    tests/examples reads the runs it kept instead of making them again."""
    from processes import run_in_session

    kept = tmp_path_factory.mktemp("demo-kept")
    result = run_in_session(
        [sys.executable, "-m", "ddpdoctor", "demo", "--keep", str(kept)], timeout=400, cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"}, merge_stderr=False, stop_gently=True,
    )
    return result, kept
