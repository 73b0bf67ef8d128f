"""`ddpdoctor demo`, the README's main command: the real tour, end to end, as a newcomer runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from processes import kill_session, run_in_session

from ddpdoctor.catalogue import CATALOGUE

REPO = Path(__file__).resolve().parents[2]


def _demo(*args: str, cwd: Path = REPO, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    """Run the demo in a session of its own; on a timeout, SIGTERM it so that it stops its runs, then kill."""
    return run_in_session([sys.executable, "-m", "ddpdoctor", "demo", *args], timeout=timeout, cwd=cwd,
                          env={**os.environ, "NO_COLOR": "1"}, merge_stderr=False, stop_gently=True)


def _summary_cells(stdout: str) -> dict[str, list[str]]:
    """class slug -> the text of each cell of its row in the summary table, a cell rich wrapped over
    several lines joined back (column by column, not line by line)."""
    cells: dict[str, list[list[str]]] = {}
    current = None
    for line in stdout.splitlines():
        match = re.match(r"│ (F\d+a?b?) ([a-z-]+)\s*│", line)
        if match:
            current = match.group(2)
            cells[current] = []
        elif not (current and re.match(r"│\s+│", line)):
            current = None
            continue
        parts = [part.strip() for part in line.split("│")[1:-1]]
        columns = cells[current]
        columns.extend([] for _ in range(len(parts) - len(columns)))
        for column, part in zip(columns, parts, strict=False):  # a shorter line: the row's last cells
            if part:
                column.append(part)
    return {slug: [" ".join(column) for column in columns] for slug, columns in cells.items()}


def _summary_rows(stdout: str) -> dict[str, str]:
    """class slug -> the text of its row in the summary table, wrapped cells included."""
    rows: dict[str, str] = {}
    current = None
    for line in stdout.splitlines():
        match = re.match(r"│ (F\d+a?b?) ([a-z-]+)\s*│(.*)", line)
        if match:
            current = match.group(2)
            rows[current] = match.group(3)
        elif current and re.match(r"│\s+│", line):
            rows[current] += " " + line
        else:
            current = None
    return rows


# the tour takes minutes, longer while other lanes' jobs share the cores; the suite's 120 s default is too
# tight (the fixture's own timeout, 900 s, comes first)
@pytest.mark.timeout(960)
def test_the_whole_demo_catches_every_class_it_promises(whole_demo):
    result, kept = whole_demo
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    rows = _summary_rows(result.stdout)
    assert set(rows) == {c.slug for c in CATALOGUE}
    assert "✗" not in result.stdout
    assert "every expected detection happened" in result.stdout
    # What each part is shown catching, as the summary says it.
    assert "✓ DDP101" in rows["collective-divergence"] and "✓ F4" in rows["collective-divergence"]
    assert "✓ DDP301" in rows["backend-device-mismatch"] and "✓ F1" in rows["backend-device-mismatch"]
    assert "✓ F6b" in rows["dead-rank"]
    assert "✓ F8" in rows["unused-parameters"]
    assert "needs GPUs" in rows["foreign-device-hooks"]
    # The guard's live report is shown, naming the user's line, not only the summary.
    assert "ddpdoctor: collective-divergence" in result.stdout
    assert re.search(r"rank 0 all_reduce\(SUM\) \[1\] float32 vs rank 1 barrier", result.stdout)
    # And the diagnosis from the log of the unguarded run.
    assert re.search(r"ddpdoctor explain output\.log -> unused-parameters", result.stdout)
    # --keep: every run's log, how it ended, and the guard's report where it ran guarded.
    kept_run = kept / "collective-divergence-broken-guarded"
    record = json.loads((kept_run / "run.json").read_text())
    assert record["guarded"] and record["returncode"] == 1 and record["ok"]
    assert record["guard_class"] == "collective-divergence"
    assert "ddpdoctor: collective-divergence" in (kept_run / "output.log").read_text()
    assert json.loads((kept_run / "report" / "report.json").read_text())
    assert str(kept) in result.stdout


@pytest.mark.timeout(240)  # its fixture builds and installs the wheel
def test_only_and_list(installed_demo_of_f9):
    listed = _demo("--list", timeout=60)
    assert listed.returncode == 0
    for failure in CATALOGUE:
        assert failure.slug in listed.stdout
    one = installed_demo_of_f9.demo  # `demo --only F9`, run once for this test and the wheel's
    assert one.returncode == 0, one.stdout + one.stderr
    assert set(_summary_rows(one.stdout)) == {"process-group-missing"}
    unknown = _demo("--only", "F99", timeout=60)
    assert unknown.returncode == 2
    assert "no failure class named 'F99'" in unknown.stderr


def test_a_missed_detection_fails_the_demo(tmp_path):
    """The tour verifies itself: an example whose log explain does not read as promised exits 1."""
    folder = tmp_path / "examples" / "dead-rank"
    folder.mkdir(parents=True)
    for name in ("broken.py", "fixed.py"):
        (folder / name).write_text(
            "import sys\nprint('RuntimeError: Default process group has not been initialized, please make "
            "sure to call init_process_group.')\nsys.exit(1)\n" if name == "broken.py" else "print('ok')\n"
        )
    (folder / "example.toml").write_text(
        'class = "dead-rank"\nsummary = "a manifest that promises the wrong diagnosis"\n'
        '[[run]]\nscript = "broken.py"\nlauncher = "python"\nexpect = "fail"\noutput = "Default process '
        'group"\nexplain = "dead-rank"\n[[run]]\nscript = "fixed.py"\nlauncher = "python"\nexpect = '
        '"pass"\noutput = "ok"\n'
    )
    result = _demo("--examples", str(tmp_path / "examples"), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "✗ explain" in result.stdout and "expected dead-rank" in result.stdout
    assert "expected detections missing for: dead-rank" in result.stdout


def test_a_fixed_run_that_needed_a_second_run_says_so_in_words(tmp_path):
    """torch 2.13's exit-time abort after a passing run: the run is made again, and the tour says so in its
    line, in the summary table and in a sentence after it, not only with a tick."""
    folder = tmp_path / "examples" / "dead-rank"
    folder.mkdir(parents=True)
    (folder / "broken.py").write_text("import sys\nprint('rank 1 died', flush=True)\nsys.exit(1)\n")
    (folder / "fixed.py").write_text(
        "import os, pathlib, sys\n"
        "print('rank 1: done', flush=True)\n"
        "mark = pathlib.Path('ran-once')\n"
        "if not mark.exists():\n"
        "    mark.write_text('x')\n"
        "    print('terminate called without an active exception', file=sys.stderr, flush=True)\n"
        "    os.abort()\n"
    )
    (folder / "example.toml").write_text(
        'class = "dead-rank"\nsummary = "a fixed run that aborts in teardown once"\n'
        '[[run]]\nscript = "broken.py"\nlauncher = "python"\nexpect = "fail"\noutput = "rank 1 died"\n'
        '[[run]]\nscript = "fixed.py"\nlauncher = "python"\nexpect = "pass"\noutput = "rank 1: done"\n'
    )
    result = _demo("--examples", str(tmp_path / "examples"), "--keep", str(tmp_path / "kept"), cwd=tmp_path,
                   timeout=60)
    assert "fixed.py passed" in result.stdout, result.stdout + result.stderr
    words = " ".join(result.stdout.split())  # rich wraps long lines
    assert "(passed on a second run: the first time, after the script had finished, torch aborted" in words
    assert "✓ run twice" in _summary_cells(result.stdout)["dead-rank"]
    assert "Run twice: dead-rank/fixed.py. The first run printed its result and then died" in words


def test_no_examples_folder_is_a_clear_error(tmp_path):
    result = _demo("--examples", str(tmp_path / "nowhere"), timeout=60)
    assert result.returncode == 2
    assert "no examples folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_interrupted_demo_leaves_no_process_behind(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", "demo", "--only", "F4", "--keep", str(tmp_path / "kept")],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Wait until the example runs have started (their scratch folders appear), then stop the demo.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _example_processes(tmp_path / "kept"):
            time.sleep(0.2)
        assert _example_processes(tmp_path / "kept"), "no example run started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert "interrupted" in err
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _example_processes(tmp_path / "kept"):
            time.sleep(0.2)
        assert not _example_processes(tmp_path / "kept")
    finally:
        kill_session(proc.pid)


def _example_processes(under: Path) -> list[int]:
    """Live processes working in a folder under `under`: the demo's runs (torchrun, ranks, Lightning)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if cwd.startswith(str(under)) and state != "Z":
            found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class InstalledDemo:
    site: Path  # where the wheel was installed
    where: subprocess.CompletedProcess[str]  # `import ddpdoctor; print(ddpdoctor.__file__)` there
    demo: subprocess.CompletedProcess[str]  # `ddpdoctor demo --only F9` from the installed copy


@pytest.fixture(scope="module")
def installed_demo_of_f9(tmp_path_factory) -> InstalledDemo:
    """`pip install ddpdoctor-*.whl`, then `ddpdoctor demo --only F9` from a folder that is not the checkout:
    one run for the test of --only and the test of the wheel."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(wheels),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site),
         *map(str, wheels.glob("ddpdoctor-*.whl"))], capture_output=True, text=True, timeout=120,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The installed copy comes first on the path (the checkout's editable install is only a .pth entry),
    # and the demo runs from a folder that is not the checkout.
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import ddpdoctor; print(ddpdoctor.__file__)"], env=env,
                           capture_output=True, text=True, timeout=60)
    one = run_in_session(
        [sys.executable, "-m", "ddpdoctor", "demo", "--only", "F9"],
        timeout=180,
        cwd=tmp_path,
        env=env,
        merge_stderr=False,
        stop_gently=True,
    )
    return InstalledDemo(site, where, one)


@pytest.mark.timeout(240)
def test_the_demo_runs_from_an_installed_wheel_without_the_checkout(installed_demo_of_f9):
    """`pip install ddpdoctor-*.whl` then `ddpdoctor demo`: the examples travel inside the package."""
    site, where, one = installed_demo_of_f9.site, installed_demo_of_f9.where, installed_demo_of_f9.demo
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    assert one.returncode == 0, one.stdout[-4000:] + one.stderr[-3000:]
    assert set(_summary_rows(one.stdout)) == {"process-group-missing"}
    assert "every expected detection happened" in one.stdout
    assert str(site) in one.stdout  # the scripts it ran are the installed ones
