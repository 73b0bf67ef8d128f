"""Per-test CPU time, the measure the suite's time budget is worked from (wall time varies with the load of a
shared machine; CPU time much less): `DDPDOCTOR_TEST_CPU=DIR scripts/test.sh ...` writes one line per test,
`node id<TAB>own CPU-s<TAB>its processes' CPU-s<TAB>wall s`, to DIR/cpu-<lane>.tsv, and the run ends with
the 30 costliest tests and the total.

"Its processes" is getrusage(RUSAGE_CHILDREN): every process the test started and waited for, with their own
waited-for children (torchrun's ranks, a spawn's workers). A module or session fixture's job is counted in
the test that first asked for it; a job the examples' fixture runs in the background is counted in the test
that was running when it ended."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

VARIABLE = "DDPDOCTOR_TEST_CPU"


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class CpuProfile:
    def __init__(self, folder: Path, lane: str, prints: bool) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.file = folder / f"cpu-{lane}.tsv"
        self.prints = prints  # a lane records; the controller (or a run without lanes) prints the summary

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        own, children = _cpu()
        started = time.monotonic()
        yield
        own_after, children_after = _cpu()
        with self.file.open("a", encoding="utf-8") as handle:
            handle.write(f"{item.nodeid}\t{own_after - own:.2f}\t{children_after - children:.2f}\t"
                         f"{time.monotonic() - started:.1f}\n")

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.prints:
            return
        rows = []
        for path in sorted(self.folder.glob("cpu-*.tsv")):
            for line in path.read_text(encoding="utf-8").splitlines():
                node, own, children, wall = line.rsplit("\t", 3)
                rows.append((float(own) + float(children), float(wall), node))
        if not rows:
            return
        rows.sort(reverse=True)
        terminalreporter.section(f"CPU time per test ({self.folder})")
        for cpu, wall, node in rows[:30]:
            terminalreporter.write_line(f"{cpu:8.1f} CPU-s {wall:7.1f} s  {node}")
        total = sum(row[0] for row in rows)
        terminalreporter.write_line(f"{total:8.1f} CPU-s in all, {len(rows)} tests")


def register(config: pytest.Config) -> None:
    folder = os.environ.get(VARIABLE)
    if not folder:
        return
    workerinput = getattr(config, "workerinput", None)
    lane = workerinput["workerid"] if workerinput else "main"
    if not workerinput:  # the controller starts before its lanes: a folder used before starts empty
        for old in Path(folder).glob("cpu-*.tsv"):
            old.unlink()
    plugin = CpuProfile(Path(folder), lane, prints=not workerinput)
    config.pluginmanager.register(plugin, "ddpdoctor-cpu-profile")
