"""Sweeping the flight files of guarded processes that ended without cleaning up (os._exit, SIGKILL)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from guard_jobs import FIXTURES, PYTHON, job_env, run_job

from ddpdoctor.guard.host import this_host
from ddpdoctor.guard.rank.leftovers import STALE_AFTER, sweep

OLD = time.time() - STALE_AFTER - 60


def dead_pid() -> int:
    done = subprocess.run(
        [PYTHON, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def job_dir(root: Path, name: str, pid: int, host: str | None = None, age: float = OLD) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "rank-0.flight").write_bytes(b"\0" * 1024)
    (path / "rank-0.meta.json").write_text(json.dumps({"rank": 0, "pid": pid, "host": host or this_host()}))
    for item in [*path.iterdir(), path]:
        os.utime(item, (age, age))
    return path


def test_only_directories_that_are_old_and_whose_ranks_are_all_gone_are_removed(tmp_path: Path) -> None:
    shared = tmp_path / f"ddpdoctor-{os.getuid()}"
    gone = dead_pid()
    abandoned = job_dir(shared, "job-1001", gone)
    running = job_dir(shared, "job-1002", os.getpid())  # old files, but its rank is alive (an idle job)
    recent = job_dir(shared, "job-1003", gone, age=time.time() - 60)  # a new job may reuse the port
    elsewhere = job_dir(shared, "job-1004", gone, host="another-host")  # /dev/shm shared across hosts
    unnamed = job_dir(tmp_path, "ddpdoctor-rank0-abc", gone)  # a job without MASTER_PORT
    kept = job_dir(shared, "job-1005", gone)
    removed = sweep(str(tmp_path), keep=str(kept))
    assert sorted(removed) == sorted([str(abandoned), str(unnamed)])
    assert not abandoned.exists() and not unnamed.exists()
    assert running.exists() and recent.exists() and elsewhere.exists() and kept.exists()
    assert (running / "rank-0.flight").exists()


def test_a_later_guarded_job_sweeps_what_a_hard_exit_left_behind() -> None:
    script = str(FIXTURES / "abandoned_files.py")
    first = run_job([PYTHON, script, "hard-exit"], timeout=60)
    assert first.returncode == 0, first.output[-2000:]
    left = Path(first.output.strip().splitlines()[-1])
    assert (left / "rank-0.flight").exists() and (left / "rank-0.meta.json").exists()
    for item in [*left.iterdir(), left]:
        os.utime(item, (OLD, OLD))
    second = subprocess.run(
        [PYTHON, script, "sweeper", str(left)], env=job_env(), capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip().splitlines()[-1] == "swept"
    assert not left.exists()
