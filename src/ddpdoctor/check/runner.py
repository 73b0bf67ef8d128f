"""Checking many files: in this process for a handful, in a process pool (one worker per core) otherwise."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from .engine import Checker, FileResult

# Below this many files per worker, starting processes costs more than it saves.
_FILES_PER_WORKER = 8

_worker: Checker | None = None


def _start_worker(codes: Sequence[str]) -> None:
    global _worker
    _worker = Checker(codes)


def _check_in_worker(task: tuple[str, bool]) -> FileResult:
    assert _worker is not None
    return _worker.check_path(*task)


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_files(
    paths: Sequence[str],
    codes: Sequence[str],
    *,
    jobs: int,
    keep_text: bool = False,
    advance: Callable[[], None] | None = None,
) -> list[FileResult]:
    workers = min(jobs, max(1, len(paths) // _FILES_PER_WORKER))
    tasks = [(path, keep_text) for path in paths]
    results: list[FileResult] = []
    if workers <= 1:
        checker = Checker(codes)
        for task in tasks:
            results.append(checker.check_path(*task))
            if advance:
                advance()
        return results
    chunksize = max(1, min(64, len(tasks) // (workers * 8)))
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(list(codes),))
    try:
        for result in pool.map(_check_in_worker, tasks, chunksize=chunksize):
            results.append(result)
            if advance:
                advance()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results
