"""The runs this session's `ddpdoctor demo --keep` made (tests/conftest.py's `whole_demo`), for tests that
would otherwise make the same run again: the demo runs every example, its broken scripts plain and guarded,
its fixed ones plain or guarded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from lanes import SESSION_GROUP

from ddpdoctor.demo.manifest import ExampleRun, RunResult, all_examples
from ddpdoctor.demo.tour import DEMO_HANG_AFTER, execute_run, read_run_record, run_folder

# A test that reads the demo's runs is marked with it: the demo's lane runs it after the demo (tests/lanes.py)
DEMO_LANE = pytest.mark.xdist_group(SESSION_GROUP)


def demo_kept_runs(request: pytest.FixtureRequest) -> Path | None:
    """Where this session's demo kept its runs, if the session ran the demo before the asking test (a
    fixture's first reader included); None where it did not (the test was run on its own, or in another
    lane) or the demo timed out (its test says so): then the caller makes its run itself."""
    items = request.session.items

    def first(wanted) -> int | None:
        return next((i for i, item in enumerate(items) if wanted(item)), None)

    demo = first(lambda item: "whole_demo" in getattr(item, "fixturenames", ()))
    if request.fixturename:  # a fixture: its first reader asks
        asking = first(lambda item: request.fixturename in getattr(item, "fixturenames", ()))
    else:
        asking = first(lambda item: item is request.node)
    if demo is None or asking is None or demo > asking:
        return None
    try:
        return request.getfixturevalue("whole_demo")[1]
    except pytest.fail.Exception:
        return None


def kept_run(kept: Path, run: ExampleRun, guarded: bool) -> tuple[RunResult, Path] | None:
    """The demo's run of `run` (plain, or under `ddpdoctor run`: its --report directory is `report/` in the
    same folder), or None where it kept none."""
    folder = run_folder(kept, run, guarded)
    done = read_run_record(folder, run)
    return None if done is None else (done, folder)


@dataclass(frozen=True)
class GuardedExampleRun:
    """An example's script under `ddpdoctor run --hang-after 5 --report DIR` (its manifest's launcher), as the
    demo runs it."""

    run: ExampleRun
    returncode: int | None  # None: killed at the manifest's timeout
    output: str  # what the job and `ddpdoctor run` printed (stderr merged)
    report: Path  # its --report directory
    seconds: float


_MADE: dict[str, GuardedExampleRun] = {}


def guarded_example_run(request: pytest.FixtureRequest, run_id: str) -> GuardedExampleRun:
    """The demo's guarded run of `run_id` ("collective-divergence/broken"), read where this session's demo
    made it before the asking test (its readers are marked DEMO_LANE), else made here with the demo's own
    command, once per lane however many tests ask. Its readers assert on the guard's verdict on the same job
    the demo shows; a job of their own for it cost the suite one more 2-rank run each."""
    [run] = [r for example in all_examples() for r in example.runs if r.id == run_id]
    kept = demo_kept_runs(request)
    done = kept_run(kept, run, guarded=True) if kept else None
    if done is not None:
        result, folder = done
        return GuardedExampleRun(run, result.returncode, result.output, folder / "report", result.seconds)
    if run_id not in _MADE:
        workdir = request.getfixturevalue("tmp_path_factory").mktemp("example-run")
        outcome = execute_run(run, workdir, guarded=True, hang_after=DEMO_HANG_AFTER)
        _MADE[run_id] = GuardedExampleRun(run, outcome.result.returncode, outcome.result.output,
                                          run_folder(workdir, run, guarded=True) / "report",
                                          outcome.result.seconds)
    return _MADE[run_id]


def example_line(run: ExampleRun, text: str) -> int:
    """The line of the run's script that holds `text` (the examples carry no line markers: they are read by
    users)."""
    lines = run.script.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)
