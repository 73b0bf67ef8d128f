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
