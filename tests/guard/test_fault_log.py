"""The fault log: what a rank that crashes writes about itself, read back as the judge reads it. Each case
crashes a real Python process (no torch needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ddpdoctor.guard.judge.fault_logs import read_fault_log

PRELUDE = """
import ctypes, os, sys, threading, time
from ddpdoctor.guard.rank import fault_log
enabled = fault_log.enable(sys.argv[1])
print("enabled" if enabled else "not enabled", flush=True)
"""


def crash(
    tmp_path: Path, body: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    script = tmp_path / "crashing.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    log = tmp_path / "rank-1.fault"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    done = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=30,
                          env={**base, **(env or {})})
    return done, script, log


def line_of(script: Path, text: str) -> int:
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def test_a_segfault_is_named_with_the_line_and_the_process_still_dies_of_it(tmp_path):
    done, script, log = crash(tmp_path, """
        def read_record(address):
            return ctypes.string_at(address)  # the crash
        def main():
            read_record(0)
        main()
    """)
    assert done.returncode == -signal.SIGSEGV, done.stderr
    fatal = read_fault_log(str(log))
    assert fatal is not None and fatal.name == "SIGSEGV"
    # innermost first: ctypes (the standard library's, named as such), then the user's line and its caller
    assert (fatal.stack[0].function, fatal.stack[0].library) == ("string_at", "python")
    assert [(f.line, f.function, f.library) for f in fatal.stack[1:3]] == [
        (line_of(script, "# the crash"), "read_record", None),
        (line_of(script, "    read_record(0)"), "main", None),
    ]
    assert "Fatal Python error" not in done.stderr  # the user's output is as it was without the guard


def test_an_abort_in_another_thread_gives_that_threads_stack(tmp_path):
    done, script, log = crash(tmp_path, """
        def check_failed():
            os.abort()  # the abort
        worker = threading.Thread(target=check_failed)
        worker.start()
        time.sleep(30)
    """)
    assert done.returncode == -signal.SIGABRT
    fatal = read_fault_log(str(log))
    assert fatal is not None and fatal.name == "SIGABRT"
    assert (fatal.stack[0].line, fatal.stack[0].function) == (line_of(script, "# the abort"), "check_failed")


def test_a_forked_childs_crash_is_not_written_into_the_parents_log(tmp_path):
    done, _, log = crash(tmp_path, """
        child = os.fork()
        if child == 0:
            os.abort()  # a DataLoader worker's crash is its own
        _, status = os.waitpid(child, 0)
        print("child signal", os.WTERMSIG(status), flush=True)
    """)
    assert done.returncode == 0, done.stderr
    assert f"child signal {int(signal.SIGABRT)}" in done.stdout
    assert read_fault_log(str(log)) is None


def test_a_faulthandler_the_user_turned_on_is_left_as_it_is(tmp_path):
    done, _, log = crash(tmp_path, "os.abort()\n", env={"PYTHONFAULTHANDLER": "1"})
    assert done.stdout.startswith("not enabled")
    assert done.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in done.stderr  # where its owner asked for it
    assert not log.exists()


def test_a_rank_that_did_not_crash_has_nothing_to_say(tmp_path):
    done, _, log = crash(tmp_path, "print('finished')\n")
    assert done.returncode == 0 and "finished" in done.stdout
    assert log.exists() and read_fault_log(str(log)) is None
    assert read_fault_log(str(tmp_path / "absent.fault")) is None
