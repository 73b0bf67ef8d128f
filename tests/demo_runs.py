"""The runs this session's `ddpdoctor demo --keep` made (tests/conftest.py's `whole_demo`), for tests that
would otherwise make the same run again: the demo runs every example, its broken scripts plain and guarded,
its fixed ones plain or guarded."""

from __future__ import annotations

from pathlib import Path

import pytest
from lanes import SESSION_GROUP

from ddpdoctor.demo.manifest import ExampleRun, RunResult
from ddpdoctor.demo.tour import read_run_record, run_folder

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
