"""`bash scripts/demo.sh`, the README's first command: it ends by saying where the `ddpdoctor` command is,
since a bare `ddpdoctor` is not on the PATH after it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from processes import run_in_session

REPO = Path(__file__).resolve().parents[2]
# demo.sh runs scripts/setup.sh first, a no-op only where setup.sh made this interpreter's .venv
pytestmark = pytest.mark.skipif(
    Path(sys.prefix) != REPO / ".venv" or not (REPO / ".venv" / ".ddpdoctor-setup").exists(),
    reason="the tests do not run in this clone's .venv made by scripts/setup.sh (demo.sh would install one)",
)


def test_demo_script_ends_with_where_the_command_is() -> None:
    done = run_in_session(["bash", "scripts/demo.sh", "--list"], timeout=300, cwd=REPO,
                          env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stdout[-3000:]
    venv = REPO / ".venv"
    tail = done.stdout.strip().splitlines()[-2:]
    assert f"run it as {venv}/bin/ddpdoctor, or first 'source .venv/bin/activate'" in tail[0]
    assert f"pip install -e {REPO}" in tail[1]
    assert os.access(venv / "bin" / "ddpdoctor", os.X_OK)


def test_demo_script_passes_the_demos_exit_code_through() -> None:
    done = run_in_session(["bash", "scripts/demo.sh", "--no-such-option"], timeout=300, cwd=REPO)
    assert done.returncode == 2
    assert "source .venv/bin/activate" in done.stdout
