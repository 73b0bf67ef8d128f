"""The demo's tour of one failure class: check the broken script, run it under the guard, explain its log,
run the fixed one; each step compared with what the example's manifest promises.

Runs are independent jobs (a process tree each) so that two can share the machine's cores; `ClassTour`
gathers the outcomes of one class and says whether every expected detection happened.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import Finding, Severity, loads
from .manifest import Example, ExampleRun, RunResult, run_example

# Real jobs keep `ddpdoctor run`'s default (minutes): a slow rank is not a hung one. The examples are small,
# so the demo decides after a few seconds.
DEMO_HANG_AFTER = 5.0


@dataclass
class CheckOutcome:
    script: Path
    expected: tuple[str, ...]
    findings: list[Finding]

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    @property
    def ok(self) -> bool:
        return self.codes == set(self.expected)


@dataclass
class RunOutcome:
    """One run of an example script, plain or under the guard, with what ddpdoctor made of it."""

    run: ExampleRun
    guarded: bool
    result: RunResult
    log: Path
    guard_findings: list[Finding] = field(default_factory=list)
    diagnoses: list = field(default_factory=list)  # explain's Diagnosis objects, best first

    @property
    def behaved(self) -> bool:
        """The script did what the catalogue says (failed that way / passed), guard or not."""
        if self.guarded and self.run.expect == "fail":
            return self.result.returncode not in (None, 0)
        return not self.result.problems()

    @property
    def guard_class(self) -> str | None:
        """The class the guard reported: its error, else (a run that only its audits flag, such as a
        sampler whose epoch never moves) its first warning."""
        errors = [f for f in self.guard_findings if f.severity == Severity.ERROR]
        found = errors or self.guard_findings
        return found[0].class_ if found else None

    @property
    def explain_class(self) -> str | None:
        return self.diagnoses[0].slug if self.diagnoses else None

    @property
    def ok(self) -> bool:
        if not self.behaved:
            return False
        if self.guarded:
            return self.guard_class == (self.run.guard if self.run.expect == "fail" else None)
        if self.run.explain:
            return self.explain_class == self.run.explain
        return True


@dataclass
class ClassTour:
    example: Example
    checks: list[CheckOutcome] = field(default_factory=list)
    broken: list[RunOutcome] = field(default_factory=list)  # plain runs of failing scripts (explained)
    guarded: list[RunOutcome] = field(default_factory=list)  # failing scripts under the guard
    fixed: list[RunOutcome] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # runs this machine cannot do, and why

    @property
    def ok(self) -> bool:
        steps: list[CheckOutcome | RunOutcome] = [*self.checks, *self.broken, *self.guarded, *self.fixed]
        return all(step.ok for step in steps)


def check_scripts(example: Example) -> list[CheckOutcome]:
    """The checker, in this process, on every script whose manifest states what `check` must report."""
    from ..check.engine import Checker
    from ..check.registry import all_rules

    checker = Checker(all_rules())
    seen: dict[Path, CheckOutcome] = {}
    for run in example.runs:
        if run.check is None or run.script in seen:
            continue
        seen[run.script] = CheckOutcome(run.script, run.check, checker.check_path(str(run.script)).findings)
    return list(seen.values())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def execute_run(run: ExampleRun, workdir: Path, guarded: bool, hang_after: float) -> RunOutcome:
    """Run one script (in its own scratch folder) and read what ddpdoctor has to say about it."""
    folder = run_folder(workdir, run, guarded)
    folder.mkdir(parents=True, exist_ok=True)
    report_dir = folder / "report"
    command = run.guarded_command(hang_after, report_dir) if guarded else None
    result = run_example(run, folder, command)
    log = folder / "output.log"
    log.write_text(result.output, encoding="utf-8")
    outcome = RunOutcome(run, guarded, result, log)
    if guarded:
        outcome.guard_findings = read_guard_report(report_dir)
    elif run.explain:
        from ..explain import explain_paths

        outcome.diagnoses = list(explain_paths([str(log)]).diagnoses)
    write_run_record(folder, outcome, command)
    return outcome


RUN_RECORD = "run.json"


def write_run_record(folder: Path, outcome: RunOutcome, command: list[str] | None) -> None:
    """What `--keep` leaves beside a run's log: how it was run, how it ended (which the log alone does not
    say: a run killed at its timeout and one that exited 1 can print the same) and what the demo made of
    it."""
    result = outcome.result
    record = {
        "run": result.run.id,
        "guarded": outcome.guarded,
        "command": command or result.run.command(),
        "returncode": result.returncode,  # null: killed at the manifest's timeout
        "seconds": round(result.seconds, 2),
        "rerun": result.rerun,
        "behaved": outcome.behaved,
        "guard_class": outcome.guard_class if outcome.guarded else None,
        "explain_class": outcome.explain_class,
        "ok": outcome.ok,
    }
    (folder / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_run_record(folder: Path, run: ExampleRun) -> RunResult | None:
    """A kept run's result (run.json and output.log), or None where the folder holds no complete run."""
    try:
        record = json.loads((folder / RUN_RECORD).read_text(encoding="utf-8"))
        output = (folder / "output.log").read_text(encoding="utf-8")
        if record["run"] != run.id:
            return None
        return RunResult(run, record["returncode"], output, record["seconds"], rerun=record["rerun"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_folder(workdir: Path, run: ExampleRun, guarded: bool) -> Path:
    return workdir / f"{_slug(run.id)}{'-guarded' if guarded else ''}"


def read_guard_report(report_dir: Path) -> list[Finding]:
    path = report_dir / "report.json"
    try:
        return loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"unreadable guard report {path}: {exc}") from exc


def start_tours(
    examples: list[Example],
    cuda_devices: int,
    workdir: Path,
    pool: ThreadPoolExecutor,
    hang_after: float = DEMO_HANG_AFTER,
    started: Callable[[ExampleRun, bool], None] | None = None,
) -> list[tuple[ClassTour, list[Future[RunOutcome]]]]:
    """Check every class now, and queue every run on `pool`; the caller collects them class by class."""
    planned = []
    for example in examples:
        tour = ClassTour(example, checks=check_scripts(example))
        # An example whose failure the guard catches runs its fixed scripts guarded too: the guard must
        # stay silent on them.
        guard_fixed = any(run.guard for run in example.runs)
        futures: list[Future[RunOutcome]] = []
        for run in example.runs:
            if not run.runnable_here(cuda_devices):
                need = f"{run.gpus} CUDA device(s)" if run.device == "cuda" else "a machine without CUDA"
                tour.skipped.append(f"{run.script.name}: needs {need}")
                continue
            if run.expect == "pass" and example.needs_gpu:
                # The CPU part of a GPU-only class proves nothing about the failure; the tests run it.
                continue
            variants = (
                [False, True]
                if run.expect == "fail" and run.guard
                else [run.expect == "pass" and guard_fixed]
            )
            for guarded in variants:
                if started:
                    started(run, guarded)
                futures.append(pool.submit(execute_run, run, workdir, guarded, hang_after))
        planned.append((tour, futures))
    return planned


def collect(tour: ClassTour, futures: list[Future[RunOutcome]]) -> ClassTour:
    for future in futures:
        outcome = future.result()
        if outcome.run.expect == "pass":
            tour.fixed.append(outcome)
        elif outcome.guarded:
            tour.guarded.append(outcome)
        else:
            tour.broken.append(outcome)
    return tour
