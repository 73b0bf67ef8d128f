"""`ddpdoctor run`: start the user's command with the guard active in every Python process, own the whole
process tree (a new session, killed as a group at the end), and turn what the ranks left into one report
and an exit code.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ..findings import Finding, Severity
from . import config as cfg
from .flight import read_flight
from .monitor import REPORTED_MARK, records_from_run_dir
from .report import collect_findings, render, write_rank_log, write_report
from .verdict import decide

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")


@dataclass
class RunOptions:
    command: list[str]
    hang_after: float = cfg.DEFAULT_HANG_AFTER
    report_dir: str | None = None
    remedy: bool = False
    heartbeat: float = cfg.DEFAULT_HEARTBEAT
    linger: float = 5.0  # how long stragglers may outlive the main process of a clean job


def guarded_env(options: RunOptions, run_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env[cfg.ENV_ACTIVE] = "1"
    env[cfg.ENV_RUN_DIR] = run_dir
    env[cfg.ENV_HANG_AFTER] = str(options.hang_after)
    env[cfg.ENV_HEARTBEAT] = str(options.heartbeat)
    if options.remedy:
        env[cfg.ENV_REMEDY] = "1"
    if options.report_dir:
        env[cfg.ENV_REPORT_DIR] = options.report_dir
    paths = [BOOTSTRAP_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _kill_group(pgid: int, grace: float = 2.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def launch(options: RunOptions) -> int:
    run_dir = tempfile.mkdtemp(prefix="ddpdoctor-run-", dir=cfg.scratch_dir())
    if options.report_dir:
        os.makedirs(options.report_dir, exist_ok=True)
    try:
        proc = subprocess.Popen(options.command, env=guarded_env(options, run_dir), start_new_session=True)
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        from ..errors import UsageError

        raise UsageError(f"cannot start {options.command[0]!r}: {exc.strerror or exc}") from exc
    pgid = proc.pid

    def forward(signum: int, _frame: Any) -> None:
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
        # The main process is gone; workers it started must not outlive the job. A failed job or one the
        # guard reported on is stopped at once; a clean one gets a moment to let workers finish.
        if rc == 0 and not os.path.exists(os.path.join(run_dir, REPORTED_MARK)):
            deadline = time.monotonic() + options.linger
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.05)
        _kill_group(pgid)
        return conclude(options, run_dir, rc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not os.environ.get("DDPDOCTOR_KEEP_RUN_DIR"):
            shutil.rmtree(run_dir, ignore_errors=True)


def conclude(options: RunOptions, run_dir: str, rc: int) -> int:
    """Findings the ranks left, plus an after-the-fact verdict from the flight files if nobody reported."""
    findings = collect_findings(run_dir)
    reported = os.path.exists(os.path.join(run_dir, REPORTED_MARK))
    records = records_from_run_dir(run_dir)
    new: list[Finding] = []
    if not reported and rc != 0 and records:
        world = max(records) + 1
        for record in records.values():
            if record.get("current"):
                record["waited"] = 0.0
        verdict = decide(records, world, dead=set(), grace=0.0, hang_after=float("inf"))
        if verdict is not None:
            finding = verdict.finding()
            findings.insert(0, finding)
            new.append(finding)
    printed = reported
    if not printed:
        shown = [f for f in findings if f not in new] + new
        if shown:
            render(shown)
    if options.report_dir:
        write_report(options.report_dir, findings)
        for name in os.listdir(options.report_dir):
            if name.startswith("report.json.tmp"):  # a rank stopped (SIGTERM by torchrun) mid-write
                try:
                    os.unlink(os.path.join(options.report_dir, name))
                except OSError:
                    pass
        for rank, record in records.items():
            target = os.path.join(options.report_dir, f"rank-{rank}.jsonl")
            if not os.path.exists(target) and record.get("flight"):
                write_rank_log(options.report_dir, rank, read_flight(record["flight"]))
    if any(f.severity == Severity.ERROR for f in findings):
        return 1
    if rc < 0:
        return 128 - rc
    return rc


