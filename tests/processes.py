"""Running a job under test: in a process session of its own, with the default signal dispositions, a
timeout, and the whole session killed afterwards whatever happened (torchrun's workers and Lightning's DDP
children included); and finding what a test left running (tests/conftest.py checks after every test)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

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
        pytest.fail(
            f"still running after {timeout} s: {command}\n{(out or '')[-4000:]}\n{(err or '')[-3000:]}"
        )
    finally:
        kill_session(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")


# --------------------------------------------------------------------------------------------------
# Signal dispositions. SIG_IGN is inherited across exec: under `nohup` (SIGHUP ignored) or from a
# non-interactive shell's `&` (SIGINT and SIGQUIT ignored) every job a test starts would ignore the signals
# the test sends it, and `ddpdoctor run` deliberately keeps an inherited SIG_IGN. So pytest replaces an
# inherited SIG_IGN by a Python handler that does nothing: pytest still ignores the signal, and exec resets
# a handled signal to its default in every job it starts. (Not a `preexec_fn`: it runs between fork and exec,
# which is unsafe in a process with threads, and some tests start jobs from threads: a child segfaulted.)

SIGNALS_TESTS_SEND = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)


def _still_ignored(_signum: int, _frame: object) -> None:
    """pytest's handler for a signal it inherited as ignored."""


def let_jobs_start_with_default_signals() -> None:
    """Called once when the tests start; see above."""
    for signum in SIGNALS_TESTS_SEND:
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, _still_ignored)


# --------------------------------------------------------------------------------------------------
# Leftover processes. Each test runs with TOKEN_VARIABLE=<its own token> in the environment; every process
# it starts inherits it (torchrun's workers in sessions of their own, orphans whose parent died), unless a
# test builds an environment without it, and those are still found as descendants of pytest.

TOKEN_VARIABLE = "DDPDOCTOR_TEST_TOKEN"


@dataclass(frozen=True)
class ProcessEntry:
    pid: int
    ppid: int
    pgid: int
    state: str
    started: int  # clock ticks after boot (/proc/PID/stat's starttime)

    @property
    def command(self) -> str:
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as handle:
                return handle.read().replace(b"\0", b" ").decode(errors="replace").strip() or "?"
        except OSError:
            return "?"


def _read_stat(pid: int) -> ProcessEntry | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
    except OSError:  # gone in between, or not ours to read
        return None
    # "pid (comm) state ppid pgrp session tty tpgid flags ... starttime (22nd)": comm may hold spaces and
    # parentheses, so split after the last ")"
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessEntry(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]))


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:
        return False


def now_in_ticks() -> int:
    """This moment on the clock of /proc/PID/stat's starttime (ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def live_processes() -> dict[int, ProcessEntry]:
    """Every process of this machine that has not exited (zombies are exited: nothing left to stop)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            entry = _read_stat(int(name))
            if entry is not None and entry.state not in ("Z", "X"):
                table[entry.pid] = entry
    return table


def processes_of_test(token: str, *, since: int = 0, exempt_groups: frozenset[int] = frozenset()
                      ) -> list[ProcessEntry]:
    """The live processes a test started: those that inherited its token, and the descendants of this
    (pytest's) process, started at `since` (clock ticks, see now_in_ticks) or later. Processes under a process
    group in `exempt_groups` (work that a session fixture runs in the background and stops itself) are not
    counted."""
    me = os.getpid()
    marker = f"{TOKEN_VARIABLE}={token}".encode()
    table = live_processes()
    found = []
    for entry in table.values():
        if entry.pid == me or entry.started < since:
            continue
        chain, current, exempt = [], entry, False
        while current is not None and current.pid not in chain and len(chain) < 64:
            chain.append(current.pid)
            exempt = exempt or current.pgid in exempt_groups
            current = table.get(current.ppid)
        if exempt:
            continue
        if me in chain or _carries(entry.pid, marker):
            found.append(entry)
    return found


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


def end_leftovers(token: str, *, since: int = 0, grace: float = 5.0, exempt_groups=lambda: frozenset()
                  ) -> list[Leftover]:
    """Wait up to `grace` seconds for the test's processes to end (a job killed at the end of a test takes a
    moment to go); kill by pid what is still there, and say what it was."""
    deadline = time.monotonic() + grace
    while True:
        left = processes_of_test(token, since=since, exempt_groups=exempt_groups())
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    found = [Leftover(entry.pid, entry.command) for entry in left]
    for entry in left:
        try:
            os.kill(entry.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found
