"""The test harness itself (tests/processes.py, tests/conftest.py, tests/cpu_profile.py): jobs under test
start with the default signal dispositions whatever pytest inherited, a test that leaves a process running
fails, and the CPU profile says which lane, group or the CPU time itself set the run's wall time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cpu_profile import VARIABLE, read_costs, where_the_time_went
from processes import (
    SIGNALS_TESTS_SEND,
    TOKEN_VARIABLE,
    end_leftovers,
    let_jobs_start_with_default_signals,
    processes_of_test,
    run_in_session,
)

TESTS = Path(__file__).parent


def _ignored_signals(status: str) -> set[int]:
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return {signum for signum in range(1, 64) if mask & (1 << (signum - 1))}


def test_a_job_does_not_inherit_ignored_signals_from_nohup_or_a_background_shell() -> None:
    """`nohup pytest` ignores SIGHUP and `pytest &` in a script SIGINT: the job under test must not."""
    saved = {signum: signal.signal(signum, signal.SIG_IGN) for signum in SIGNALS_TESTS_SEND}
    try:
        plain = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True, timeout=10)
        let_jobs_start_with_default_signals()  # what tests/conftest.py does when pytest starts
        job = run_in_session(["cat", "/proc/self/status"], timeout=10)
        # ... and pytest itself still ignores them
        still_ignored = [signal.getsignal(signum) not in (signal.SIG_DFL, signal.default_int_handler)
                         for signum in SIGNALS_TESTS_SEND]
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert set(SIGNALS_TESTS_SEND) <= _ignored_signals(plain.stdout)  # what the job would have inherited
    assert not set(SIGNALS_TESTS_SEND) & _ignored_signals(job.stdout)
    assert all(still_ignored)


def test_an_orphan_in_a_session_of_its_own_is_found_by_the_token_it_inherited() -> None:
    """What torchrun's workers are when `ddpdoctor run` (their grandparent) is killed: not our descendants."""
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN_VARIABLE: token}
    # the shell starts `sleep` in a new session and exits at once: sleep's parent is gone
    subprocess.run(
        ["sh", "-c", "setsid sleep 60 >/dev/null 2>&1 </dev/null &"], env=env, timeout=10, check=True
    )
    deadline = time.monotonic() + 10
    # (until setsid has exec'd sleep: its command line changes then)
    found = processes_of_test(token)
    while [e.command for e in found] != ["sleep 60"] and time.monotonic() < deadline:
        time.sleep(0.05)
        found = processes_of_test(token)
    assert [e.command for e in found] == ["sleep 60"]
    left = end_leftovers(token, grace=0.5)
    assert [e.pid for e in left] == [found[0].pid]
    deadline = time.monotonic() + 5
    while processes_of_test(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of_test(token) == []


def test_a_test_that_leaves_a_process_running_fails_and_the_process_is_ended(tmp_path: Path) -> None:
    """A pytest run of its own with this conftest: one test leaks a process in a session of its own (as a
    timed-out job would), the next does not. The first fails, the second passes, and nothing is left."""
    for name in ("conftest.py", "processes.py", "lanes.py", "ports.py", "cpu_profile.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    pid_file = tmp_path / "leaked.pid"
    (tmp_path / "test_leaks.py").write_text(
        "import subprocess, sys\n"
        "def test_leaks():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
        "                             start_new_session=True)\n"
        f"    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "def test_clean():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
    )
    # without DDPDOCTOR_TEST_CPU: that pytest would empty the profile's folder, as a run of its own does
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    done = run_in_session([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stdout
    # reported as an error in the teardown of the test that leaked (the check runs once its fixtures are done)
    assert "ERROR at teardown of test_leaks" in done.stdout and "2 passed, 1 error" in done.stdout, (
        done.stdout
    )
    assert "test_leaks.py::test_leaks left 1 process(es) running (killed now)" in done.stdout
    assert "time.sleep(120)" in done.stdout
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or " Z " in Path(f"/proc/{pid}/stat").read_text()


def test_the_cpu_profile_names_each_lanes_busy_time_its_longest_groups_and_the_cpu_floor(
    tmp_path: Path,
) -> None:
    (tmp_path / "cpu-gw0.tsv").write_text(
        "tests/demo/test_demo.py::test_whole@session-fixtures\t0.10\t99.90\t90.0\n"
        "tests/examples/test_examples.py::test_run[dead-rank/broken]@session-fixtures\t0.00\t0.00\t10.0\n"
    )
    (tmp_path / "cpu-gw1.tsv").write_text(
        "tests/guard/test_x.py::test_a[one@two]\t0.00\t20.00\t30.0\n"
        "tests/guard/test_x.py::test_b@tests/guard/test_x.py::job\t1.00\t29.00\t40.0\n"
    )
    costs = read_costs(tmp_path)
    assert [c.group for c in costs] == ["session-fixtures", "session-fixtures", None,
                                        "tests/guard/test_x.py::job"]
    lines = where_the_time_went(costs, cores=2)
    assert "  gw0       2 tests    100.0 CPU-s   100.0 s busy" in lines
    assert "  gw1       2 tests     50.0 CPU-s    70.0 s busy" in lines
    groups = lines.index("the 2 longest groups (each runs in one lane, one test after another):")
    assert lines[groups + 1].split() == ["100.0", "s", "100.0", "CPU-s", "2", "tests", "session-fixtures"]
    assert lines[groups + 2].split()[-1] == "tests/guard/test_x.py::job"
    assert lines[-1] == "the CPU time alone on 2 cores: at least 75 s of wall time"
