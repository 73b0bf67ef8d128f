from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import cpu_profile
import pytest
from lanes import group_by_shared_fixtures, name_the_groups_in_node_ids
from processes import TOKEN_VARIABLE, end_leftovers, let_jobs_start_with_default_signals, now_in_ticks

REPO = Path(__file__).resolve().parent.parent


let_jobs_start_with_default_signals()


def run_cli(
    *args: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
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


def pytest_configure(config: pytest.Config) -> None:
    """Where PYTHONDONTWRITEBYTECODE is set (this machine's shells set it), Python writes no .pyc: every lane
    compiled every test module again (pytest caches its assert-rewritten modules only where bytecode may be
    written: collecting the suite cost 19 CPU-seconds instead of 10, in each lane, every run), and every
    process that imports ddpdoctor (each guarded rank, each `ddpdoctor run`, `explain`, `demo`) compiled
    its modules from source: 2 of the 16 CPU-seconds of a guarded 2-rank job (measured), over a hundred such
    jobs a run. So the suite's own processes write their bytecode (into __pycache__, ignored by git), and
    the controller byte-compiles ddpdoctor once before any lane starts; the jobs keep the variable and read
    those files (Python reads up-to-date .pyc files whatever the variable says)."""
    sys.dont_write_bytecode = False
    cpu_profile.register(config)  # DDPDOCTOR_TEST_CPU=DIR: CPU time per test (tests/cpu_profile.py)
    if hasattr(config, "workerinput"):  # an xdist lane: the controller compiled ddpdoctor
        return
    import compileall

    import ddpdoctor

    # not the examples: scripts run as __main__ (never from a .pyc), and the wheel ships examples/**/*
    package = Path(ddpdoctor.__file__).parent
    compileall.compile_dir(str(package), quiet=1, rx=re.compile(r"[/\\]examples[/\\]"))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (tests/lanes.py)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group_by_shared_fixtures(items)
    if config.getoption("loadgroup", default=False) or config.getoption("dist", default="no") == "loadgroup":
        name_the_groups_in_node_ids(items)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def whole_demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`ddpdoctor demo --keep DIR`, the README's main command, run once per session in a session of its own
    (on a timeout it gets SIGTERM, to stop its runs, then SIGKILL). tests/demo reads its output;
    tests/examples reads the runs it kept instead of making them again. Its timeout leaves room for the
    other lanes' jobs sharing the cores (scripts/test.sh)."""
    from processes import run_in_session

    kept = tmp_path_factory.mktemp("demo-kept")
    result = run_in_session(
        [sys.executable, "-m", "ddpdoctor", "demo", "--keep", str(kept)], timeout=900, cwd=REPO,
        # 120 columns, as run_cli: without a terminal or COLUMNS rich draws 80, where the summary's check
        # column shows "DDP1…" (the environment, not the demo, decided whether this test passed)
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}, merge_stderr=False, stop_gently=True,
    )
    return result, kept


def _example_runs_in_progress() -> frozenset[int]:
    """The process groups of example runs that a session fixture (tests/examples) runs in the background
    while other tests go on; their runner kills each group when the run ends."""
    from ddpdoctor.demo import manifest

    with manifest._RUNNING_LOCK:
        return frozenset(manifest._RUNNING)


BETWEEN_TESTS = "between-tests"  # the token's value outside any test (no test's leftovers carry it)


@pytest.fixture(autouse=True)
def no_process_left_behind(request):
    """After every test: nothing it started may still be running. What is left is killed by pid and the test
    fails (as an error in its teardown) with the list; a hung job must not spin on after its test."""
    if not os.path.isdir("/proc/self"):
        yield
        return
    token = uuid.uuid4().hex
    since = now_in_ticks() - os.sysconf("SC_CLK_TCK")  # a process older than the test (1 s margin) is not its
    previous = os.environ.get(TOKEN_VARIABLE)
    os.environ[TOKEN_VARIABLE] = token
    try:
        yield
    finally:
        # Set back, never deleted: a session fixture's thread may be copying the environment at this moment
        # (`{**os.environ}` lists the keys, then reads each one: a key deleted in between is a KeyError,
        # seen once in CI in the example runs' pool). Between tests the value is no test's token.
        os.environ[TOKEN_VARIABLE] = previous if previous is not None else BETWEEN_TESTS
    left = end_leftovers(token, since=since, exempt_groups=_example_runs_in_progress)
    if left:
        listing = "\n".join(f"  pid {e.pid}: {e.command[:200]}" for e in left)
        pytest.fail(f"{request.node.nodeid} left {len(left)} process(es) running (killed now):\n{listing}",
                    pytrace=False)
