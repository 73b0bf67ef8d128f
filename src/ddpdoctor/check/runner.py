"""Checking many files: in this process for a handful, in a process pool (one worker per core) otherwise.

Two passes. The first reads and parses every file once, runs every rule with what the file alone shows
and keeps a small summary of the file (project.py); the summaries make the project index, built once per
run in this process. The second pass gives the index to the workers (inherited through fork where the
platform has it, pickled once per worker otherwise) and runs the rules that follow calls across functions
and files again on the few files where other files can change their answer (`needs_project`); their
findings replace the first pass's findings of those rules.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from .engine import TOOL_CODES, Checker, FileResult, uses_project
from .project import ModuleSummary, ProjectFiles, ProjectIndex
from .registry import all_rules

# Below this many files per worker, starting processes costs more than it saves.
_FILES_PER_WORKER = 8

_worker: Checker | None = None
_files: ProjectFiles | None = None
_inherited: ProjectIndex | None = None  # set before a forked pool starts: the children see it


@contextmanager
def few_collections() -> Iterator[None]:
    """Parsing makes hundreds of thousands of short-lived, acyclic AST nodes; with the default thresholds
    the cyclic collector runs thousands of times per tree and re-scans what lives on (about a sixth of the
    checker's time, measured on the torch tree). Collect rarely while checking, as usual afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(50_000, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _start_worker(codes: Sequence[str], files: ProjectFiles | None, index: ProjectIndex | None) -> None:
    global _worker, _files
    gc.set_threshold(50_000, 50, 1000)  # a worker only checks (see few_collections)
    _worker = Checker(codes, index if index is not None else _inherited)
    _files = files


def _first_in_worker(task: tuple[str, bool]) -> tuple[FileResult, ModuleSummary | None]:
    assert _worker is not None and _files is not None
    return _worker.first_pass(task[0], _files, task[1])


def _second_in_worker(task: tuple[str, bool]) -> FileResult:
    assert _worker is not None
    return _worker.second_pass(*task)


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
    indexes: list[ProjectIndex] | None = None,
    context: Sequence[str] = (),
) -> list[FileResult]:
    """Check the files as one project. `indexes`, when given, receives the run's project index (for
    checking a file again after a fix, with what the other files showed). `context` files are read for
    the index only (the local modules the checked files import): no result is returned for them."""
    global _inherited
    tasks = [(path, keep_text) for path in paths] + [(path, False) for path in context]
    workers = min(jobs, max(1, len(tasks) // _FILES_PER_WORKER))
    files = ProjectFiles([*paths, *context])
    registry = all_rules()
    project_rules = any(uses_project(registry[c]) for c in codes if c in registry)
    results: list[FileResult] = []
    summaries: list[ModuleSummary] = []
    if workers <= 1:
        with few_collections():
            return _check_here(tasks, len(paths), codes, files, project_rules, registry, advance, indexes)

    chunksize = max(1, min(64, len(tasks) // (workers * 8)))
    for result, summary in _pooled(_first_in_worker, tasks, workers, chunksize, (list(codes), files, None),
                                   advance):
        results.append(result)
        if summary is not None:
            summaries.append(summary)
    results = results[:len(paths)]  # the context files served the index
    if not project_rules:
        return results
    index = ProjectIndex(summaries, files)
    if indexes is not None:
        indexes.append(index)
    wanted = [task for task, result in zip(tasks, results, strict=False) if _second_wanted(result, index)]
    fork = "fork" in multiprocessing.get_all_start_methods()
    _inherited = index if fork else None
    try:
        second = dict(zip((p for p, _ in wanted), _pooled(
            _second_in_worker, wanted, workers, chunksize, (list(codes), None, None if fork else index), None,
            context=multiprocessing.get_context("fork") if fork else None), strict=True))
    finally:
        _inherited = None
    _merge(results, [second.get(r.path) for r in results], registry)
    return results


def _check_here(tasks: list[tuple[str, bool]], reported: int, codes: Sequence[str], files: ProjectFiles,
                project_rules: bool, registry: dict, advance: Callable[[], None] | None,
                indexes: list[ProjectIndex] | None) -> list[FileResult]:
    """The first `reported` tasks are the checked files; the others only feed the index."""
    checker = Checker(codes)
    results: list[FileResult] = []
    summaries: list[ModuleSummary] = []
    for path, keep in tasks:
        result, summary = checker.first_pass(path, files, keep)
        results.append(result)
        if summary is not None:
            summaries.append(summary)
        if advance:
            advance()
    results = results[:reported]
    if project_rules:
        index = ProjectIndex(summaries, files)
        if indexes is not None:
            indexes.append(index)
        checker.project = index
        _merge(results, [checker.second_pass(p, k) if _second_wanted(r, index) else None
                         for (p, k), r in zip(tasks, results, strict=False)], registry)
    return results


def _second_wanted(result: FileResult, index: ProjectIndex) -> bool:
    return not any(f.code in TOOL_CODES for f in result.findings) and index.needs_project(result.path)


def _merge(results: list[FileResult], again: Sequence[FileResult | None], registry: dict) -> None:
    for result, more in zip(results, again, strict=True):
        if more is None:
            continue
        result.findings = [
            f for f in result.findings if not (f.code in registry and uses_project(registry[f.code]))
        ]
        result.findings.extend(more.findings)
        result.findings.sort(key=lambda f: (f.location.line or 0) if f.location else 0)
        if more.text is not None:
            result.text = more.text


def _pooled(function: Callable[[Any], Any], tasks: list, workers: int, chunksize: int, initargs: tuple,
            advance: Callable[[], None] | None, context: Any = None) -> list:
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=initargs,
                               mp_context=context)
    out = []
    try:
        for item in pool.map(function, tasks, chunksize=chunksize):
            out.append(item)
            if advance:
                advance()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return out
