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
from dataclasses import dataclass
from pathlib import Path

import pytest

VARIABLE = "DDPDOCTOR_TEST_CPU"


@dataclass(frozen=True)
class TestCost:
    node: str  # the node id, with its xdist group after "@" where it has one (tests/lanes.py)
    lane: str  # gw0, gw1, ... or main (a run without lanes)
    cpu: float  # its own CPU-s and its processes'
    wall: float

    @property
    def group(self) -> str | None:
        """The xdist group: after the "@" that follows the test's name and parameters."""
        name = self.node.partition("::")[2]
        tail = name.rpartition("]")[2] if "[" in name else name
        return tail.partition("@")[2] or None


def read_costs(folder: Path) -> list[TestCost]:
    costs = []
    for path in sorted(folder.glob("cpu-*.tsv")):
        lane = path.stem.removeprefix("cpu-")
        for line in path.read_text(encoding="utf-8").splitlines():
            node, own, children, wall = line.rsplit("\t", 3)
            costs.append(TestCost(node, lane, float(own) + float(children), float(wall)))
    return costs


def where_the_time_went(costs: list[TestCost], cores: int, groups: int = 5) -> list[str]:
    """Lines that say whether one lane or one group set the run's wall time, or the CPU time did."""
    lines = ["lanes (busy: their tests' wall time together):"]
    for lane in sorted({c.lane for c in costs}):
        mine = [c for c in costs if c.lane == lane]
        lines.append(f"  {lane:5} {len(mine):5} tests {sum(c.cpu for c in mine):8.1f} CPU-s "
                     f"{sum(c.wall for c in mine):7.1f} s busy")
    grouped: dict[str, list[TestCost]] = {}
    for cost in costs:
        if cost.group is not None:
            grouped.setdefault(cost.group, []).append(cost)
    longest = sorted(grouped.items(), key=lambda item: -sum(c.wall for c in item[1]))[:groups]
    if longest:
        lines.append(f"the {len(longest)} longest groups (each runs in one lane, one test after another):")
        for name, mine in longest:
            lines.append(f"  {sum(c.wall for c in mine):7.1f} s {sum(c.cpu for c in mine):8.1f} CPU-s "
                         f"{len(mine):4} tests  {name}")
    total = sum(c.cpu for c in costs)
    lines.append(f"the CPU time alone on {cores} cores: at least {total / cores:.0f} s of wall time")
    return lines


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
        costs = read_costs(self.folder)
        if not costs:
            return
        terminalreporter.section(f"CPU time per test ({self.folder})")
        for cost in sorted(costs, key=lambda c: -c.cpu)[:30]:
            terminalreporter.write_line(f"{cost.cpu:8.1f} CPU-s {cost.wall:7.1f} s  {cost.node}")
        terminalreporter.write_line(f"{sum(c.cpu for c in costs):8.1f} CPU-s in all, {len(costs)} tests")
        for line in where_the_time_went(costs, os.cpu_count() or 1):
            terminalreporter.write_line(line)


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
