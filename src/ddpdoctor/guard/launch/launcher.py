"""`ddpdoctor run`: start the user's command with the guard active in every Python process, own the whole
process tree (a new session, killed as a group at the end), and turn what the ranks left into one report
and an exit code.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...errors import UsageError
from ...findings import Finding, Severity
from ...render.audit_summary import render_summary
from .. import config as cfg
from ..host import pid_alive, this_host, zombie_status
from ..judge.flight_files import read_flight
from ..judge.rank_rows import died_of_a_failed_collective
from ..judge.records import failed_alike, records_from_run_dir
from ..judge.verdict import Decision, decide, died_first
from ..model import RankMeta, RankRecord, RankState
from ..protocol import Mark, RunDir, read_json
from ..report import clear_previous, collect_findings, render, write_rank_log, write_report
from .found_by_ranks import with_ranks
from .recap import recap_lines, recap_of

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bootstrap")


@dataclass
class RunOptions:
    command: list[str]
    hang_after: float = cfg.DEFAULT_HANG_AFTER
    report_dir: str | None = None
    remedy: bool = False
    heartbeat: float = cfg.DEFAULT_HEARTBEAT
    linger: float = 5.0  # how long stragglers may outlive the main process of a clean job
    slow_after: float | None = None  # None: the guard's default (config.py)
    strict: bool = False  # any finding, a warning too, makes the run exit 1
    stop_always: bool = False  # stop also where the program handles the failure (rank/stop_policy.py)


def guarded_env(options: RunOptions, run_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env[cfg.ENV_ACTIVE] = "1"
    env[cfg.ENV_RUN_DIR] = run_dir
    env[cfg.ENV_HANG_AFTER] = str(options.hang_after)
    env[cfg.ENV_HEARTBEAT] = str(options.heartbeat)
    env.pop(cfg.ENV_SLOW_AFTER, None)
    if options.slow_after is not None:
        env[cfg.ENV_SLOW_AFTER] = str(options.slow_after)
    # The options are this run's flags only, not whatever an enclosing run left in the environment.
    env.pop(cfg.ENV_REMEDY, None)
    env.pop(cfg.ENV_REPORT_DIR, None)
    env.pop(cfg.ENV_STOP_ALWAYS, None)
    if options.stop_always:
        env[cfg.ENV_STOP_ALWAYS] = "1"
    if options.remedy:
        env[cfg.ENV_REMEDY] = "1"
    if options.report_dir:
        env[cfg.ENV_REPORT_DIR] = options.report_dir
    # Entries are kept as they are: an empty one (`:$HOME/lib`) puts the working directory on sys.path.
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + existing if existing else "")
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


class RankDeaths:
    """When each rank's process was last seen alive and first seen gone, watched by the launcher.

    The launcher (torchrun) stops the surviving ranks a fraction of a second after one dies, often
    before their guard has decided anything. Only the order of the deaths then says which rank took
    the job down, and only a process watching from outside sees it. On Linux each rank's pidfd wakes
    the watcher the moment that rank exits; elsewhere the pids are polled.
    """

    SCAN = 0.05  # how often to look for ranks that started since (a rank may die within a second of starting)
    # After a rank reported, the job has this long to end on its own (ranks stop at their next heartbeat,
    # torchrun follows); a rank that cannot (SIGSTOPped, stuck in C++ ignoring SIGTERM) is not waited for.
    AFTER_REPORT = 10.0
    POLL = 0.02  # without pidfds: torchrun looks at its workers every 0.1 s, a death must show before that

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.host = this_host()
        self.pids: dict[int, int] = {}
        self.alive_at: dict[int, float] = {}
        self.gone_at: dict[int, float] = {}
        self.status: dict[
            int, int
        ] = {}  # wait status, where it could be read before torchrun reaped the rank
        self._stamps: dict[str, int] = {}
        self._fds: dict[int, int] = {}  # pidfd -> rank
        self._poller = select.poll() if hasattr(os, "pidfd_open") and hasattr(select, "poll") else None
        self._reported_at: float | None = None

    def _overdue(self, now: float) -> bool:
        """Whether a report was made long enough ago that the job should have ended by now."""
        if self._reported_at is None:
            if RunDir(self.run_dir).has(Mark.REPORTED):
                self._reported_at = now
            return False
        return now - self._reported_at > self.AFTER_REPORT

    def wait(self, proc: subprocess.Popen) -> int | None:
        """Wait for the job's main process, noting every rank's death on the way; None if it outlived a
        report by AFTER_REPORT (the caller stops it)."""
        try:
            own = os.pidfd_open(proc.pid) if self._poller is not None else None
        except OSError:
            own, self._poller = None, None
        try:
            if own is None:
                return self._wait_polling(proc)
            assert self._poller is not None
            self._poller.register(own, select.POLLIN)
            next_scan = 0.0
            while True:
                now = time.monotonic()
                if now >= next_scan:
                    self._find_ranks()
                    next_scan = now + self.SCAN
                    if self._overdue(now):
                        return None
                events = self._poller.poll(max(0.0, next_scan - time.monotonic()) * 1000)
                now = time.monotonic()
                for fd, _ in events:
                    if fd == own:
                        continue
                    self._gone(self._fds.pop(fd), now)
                    self._poller.unregister(fd)
                    os.close(fd)
                for rank in self.pids:
                    if rank not in self.gone_at:
                        self.alive_at[rank] = now
                if any(fd == own for fd, _ in events):
                    return proc.wait()
        finally:
            if own is not None:
                os.close(own)
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()

    def _wait_polling(self, proc: subprocess.Popen) -> int | None:
        while True:
            try:
                return proc.wait(timeout=self.POLL)
            except subprocess.TimeoutExpired:
                self._find_ranks()
                now = time.monotonic()
                if self._overdue(now):
                    return None
                for rank, pid in self.pids.items():
                    if rank in self.gone_at:
                        continue
                    if pid_alive(pid):
                        self.alive_at[rank] = now
                    else:
                        self._gone(rank, now)

    def _gone(self, rank: int, when: float) -> None:
        if rank in self.gone_at:
            return
        self.gone_at[rank] = when
        status = zombie_status(self.pids[rank])
        if status is not None:
            self.status[rank] = status

    def _find_ranks(self) -> None:
        for _, path in RunDir(self.run_dir).metas():
            try:
                stamp = os.stat(path).st_mtime_ns
                if self._stamps.get(path) == stamp:
                    continue
            except OSError:
                continue
            meta = RankMeta.from_json(read_json(path))
            if meta is None:
                continue  # being written: read it on the next scan
            self._stamps[path] = stamp
            if meta.host != self.host or meta.pid == os.getpid() or self.pids.get(meta.rank) == meta.pid:
                continue
            self._watch(meta.rank, meta.pid)

    def _watch(self, rank: int, pid: int) -> None:
        """A new rank, or the same rank restarted by torchrun with a new process."""
        for fd, watched in list(self._fds.items()):
            if watched == rank:
                assert self._poller is not None
                self._poller.unregister(fd)
                os.close(self._fds.pop(fd))
        self.pids[rank] = pid
        self.gone_at.pop(rank, None)
        self.status.pop(rank, None)
        now = time.monotonic()
        if self._poller is not None:
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # already gone
                self._gone(rank, now)
                return
            self._fds[fd] = rank
            self._poller.register(fd, select.POLLIN)
        if pid_alive(pid):
            self.alive_at[rank] = now
        else:
            self._gone(rank, now)

    def first(self) -> set[int]:
        """The ranks that died while every other rank was still alive; empty when the deaths cannot be
        ordered. A rank that ended by SIGTERM is taken as stopped by the launcher, never as the first:
        on a busy machine the watcher may wake only after both deaths, and then only that tells them
        apart."""
        if len(self.pids) < 2:
            return set()
        stopped = {r for r, status in self.status.items() if status & 0x7F == signal.SIGTERM}
        candidates = {r: t for r, t in self.gone_at.items() if r not in stopped}
        if not candidates:
            return set()
        earliest = min(candidates.values())
        first = {r for r, t in candidates.items() if t == earliest}
        others = [r for r in self.pids if r not in first]
        if others and all(r in stopped or self.alive_at.get(r, 0.0) >= earliest for r in others):
            return first
        return set()


def job_processes(run_dir: str) -> list[int]:
    """The processes of this host started under this run, wherever they sit in the process tree: those
    whose environment carries the run's directory. torchrun starts each worker in a session of its own,
    so a worker whose agent died is in no process group of ours, yet it still carries the variable."""
    entry = b"\0" + f"{cfg.ENV_RUN_DIR}={run_dir}".encode() + b"\0"
    own = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: the process group is all there is to go on
        return []
    found = []
    for name in names:
        if not name.isdigit() or int(name) == own:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if entry in b"\0" + environ:
            found.append(int(name))
    return found


def _kill_stragglers(run_dir: str, grace: float = 2.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = job_processes(run_dir)
        if not pids:
            return
        for pid in pids:
            _signal(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
            time.sleep(0.05)


class CommandNotStarted(UsageError):
    """The job's command could not be executed. Exit 127 (not found) or 126 (found, not executable), as
    a shell, `env` and `timeout` answer."""

    def __init__(self, program: str, exc: OSError) -> None:
        self.exit_code = 127 if isinstance(exc, FileNotFoundError) else 126
        reason = exc.strerror or str(exc)
        path = shutil.which(program) or (program if os.sep in program else None)
        if isinstance(exc, FileNotFoundError) and path and os.path.isfile(path):
            # execve's ENOENT for a file that exists: its #! interpreter is missing
            interpreter = _shebang(path)
            if interpreter:
                reason = f"its interpreter {interpreter!r} (the #! line) was not found"
        elif isinstance(exc, FileNotFoundError) and path is None and os.path.isfile(program):
            # `ddpdoctor run train.py`: a file here, which a command name without a slash is not looked up as
            reason = "no such command (a file of that name is here, but commands are looked up on PATH)"
        if os.path.isfile(program) and program.endswith(".py") and not _shebang(program):
            reason += f"; to run a Python script, name the interpreter: `ddpdoctor run -- python {program}`"
        super().__init__(f"cannot start {program!r}: {reason}")


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            first = handle.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    return first[2:].decode("utf-8", "replace").strip().split(" ")[0] or None


def unguardable_python(command: list[str]) -> str | None:
    """The flag of a Python started so that it cannot load the guard (`python -I`, `-E`, `-S`: they skip
    PYTHONPATH or `site`, and so the bootstrap), or None."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    for token in command[1:]:
        if not token.startswith("-") or token.startswith("--") or token == "-":
            return None
        for letter in token[1:]:
            if letter in "IES":
                return f"-{letter}"
            if letter in "cmWXQ":  # takes an argument, or ends the options
                return None
    return None


def _writable_report_dir(path: str) -> None:
    """Fail before the job runs, not after it, when --report cannot be written."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise UsageError(f"--report {path}: cannot write there ({exc.strerror or exc})") from exc


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_orphans() -> None:
    """As PID 1 (`docker run IMAGE ddpdoctor run -- ...`, no init) every orphan of the job becomes our child;
    one that exited stays a zombie, and a zombie still counts as a live member of the job's process group.
    Only called once the job's main process is reaped and its ranks' deaths are read: reaping earlier would
    take an orphaned rank's exit status before RankDeaths reads it."""
    if os.getpid() != 1:
        return  # orphans go to init; any other child of ours is not ours to reap
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class JobSignals:
    """Signals meant for the job while it runs: forwarded to it, and remembered. A job stopped on request
    is not judged after the fact: its ranks died because they were told to, and nothing else is known
    about them. SIGHUP and SIGQUIT too: the job runs in a session of its own, so neither a closed terminal
    nor Ctrl-\\ would reach it, and ddpdoctor dying of SIGQUIT would leave it running. Ctrl-Z and `fg`
    stop and continue the job with us."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.job: list[int] = []  # the job's process group, once started
        self.run_dir: str | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> JobSignals:
        # A signal ignored when we started stays ignored, for the job too: `nohup ddpdoctor run ...` must
        # survive the terminal closing, and `... &` in a script must not stop on the terminal's Ctrl-C.
        for sig in FORWARDED_SIGNALS:
            if signal.getsignal(sig) != signal.SIG_IGN:
                self.previous[sig] = signal.signal(sig, self.forward)
        self.previous[signal.SIGCONT] = signal.signal(
            signal.SIGCONT, lambda _signum, _frame: self.pause(signal.SIGCONT)
        )
        if signal.getsignal(signal.SIGTSTP) != signal.SIG_IGN and os.getpid() != 1:
            self.previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self.suspend)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def started(self, pgid: int) -> None:
        self.job.append(pgid)
        for signum in list(self.received):  # arrived while the job was being started
            _signal_group(pgid, signum)

    def forward(self, signum: int, _frame: Any) -> None:
        self.received.append(signum)
        if self.run_dir:  # first, so that no rank reports a peer this signal is about to end as dead
            RunDir(self.run_dir).set_mark(Mark.STOPPING, "launcher")
        for pgid in self.job:
            _signal_group(pgid, signum)

    def pause(self, signum: int) -> None:
        for pgid in self.job:
            _signal_group(pgid, signum)
        if self.run_dir:  # torchrun's workers sit in sessions of their own, out of the job's process group
            for pid in job_processes(self.run_dir):
                _signal(pid, signum)

    def suspend(self, _signum: int, _frame: Any) -> None:
        # Ctrl-Z: the job is not in the terminal's foreground group, so only we got it. SIGSTOP, not
        # SIGTSTP: the kernel discards SIGTSTP sent to an orphaned process group, which the job's is.
        self.pause(signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)


def launch(options: RunOptions) -> int:
    if options.report_dir:
        _writable_report_dir(options.report_dir)
        clear_previous(options.report_dir, older_than=time.time())
    _warn_unguardable(options.command)
    run_dir = None
    try:
        with JobSignals() as signals:
            run_dir = signals.run_dir = tempfile.mkdtemp(prefix="ddpdoctor-run-", dir=cfg.scratch_dir())
            return _run_job(options, run_dir, signals)
    finally:
        if run_dir and not os.environ.get("DDPDOCTOR_KEEP_RUN_DIR"):
            shutil.rmtree(run_dir, ignore_errors=True)


def _warn_unguardable(command: list[str]) -> None:
    flag = unguardable_python(command)
    if flag:
        why = "-S skips site" if flag == "-S" else flag + " ignores PYTHONPATH"
        print(
            f"[ddpdoctor] warning: `python {flag}` does not load the guard ({why}), so this process runs "
            "unguarded; drop the flag, or call ddpdoctor.install() in the program",
            file=sys.stderr,
            flush=True,
        )


def _run_job(options: RunOptions, run_dir: str, signals: JobSignals) -> int:
    """Run the job to its end, stop whatever of it is left, and judge it."""
    try:
        proc = subprocess.Popen(options.command, env=guarded_env(options, run_dir), start_new_session=True)
    except OSError as exc:
        raise CommandNotStarted(options.command[0], exc) from exc
    pgid = proc.pid
    signals.started(pgid)
    deaths = RankDeaths(run_dir)
    waited = deaths.wait(proc)
    # Ranks still running now are stopped by us below, not dead of their own accord.
    outlived = {r for r in deaths.pids if r not in deaths.gone_at}
    if waited is None:  # reported, and still running well after: a rank that cannot stop by itself
        _kill_group(pgid)
        _kill_stragglers(run_dir)
    rc = proc.wait() if waited is None else waited
    # The main process is gone; workers it started must not outlive the job. A failed job or one the
    # guard reported on is stopped at once; a clean one gets a moment to let workers finish.
    if rc == 0 and not RunDir(run_dir).has(Mark.REPORTED):
        _linger(run_dir, deaths, pgid, options.linger)
    _kill_group(pgid)
    _kill_stragglers(run_dir)
    if os.environ.get("DDPDOCTOR_DEBUG"):
        print(f"[ddpdoctor] deaths: pids {deaths.pids} alive_at {deaths.alive_at} gone_at {deaths.gone_at} "
              f"status {deaths.status} -> first {deaths.first()}", file=sys.stderr)
    return conclude(options, run_dir, rc, deaths.first(), deaths.status, interrupted=bool(signals.received),
                    outlived=outlived)


def _linger(run_dir: str, deaths: RankDeaths, pgid: int, linger: float) -> None:
    """After a clean exit of the main process: other processes get `linger` seconds; ranks as long as they
    run (Lightning's rank 0 is the main process, and a rank 1 that finishes its own post-processing later
    would be cut short): a rank still runs under its guard, which reports if it hangs in a collective."""
    deadline = time.monotonic() + linger
    while not RunDir(run_dir).has(Mark.REPORTED):
        if not any(pid_alive(pid) for pid in deaths.pids.values()) and (
            time.monotonic() >= deadline or not _group_alive(pgid)
        ):
            return
        _reap_orphans()
        time.sleep(0.05)


def conclude(
    options: RunOptions,
    run_dir: str,
    rc: int,
    died_before_the_rest: set[int] | None = None,
    statuses: dict[int, int] | None = None,
    interrupted: bool = False,
    outlived: set[int] | None = None,
) -> int:
    """Findings the ranks left, plus an after-the-fact verdict from the flight files if nobody reported.

    `died_before_the_rest`: the ranks seen gone while the others still ran (`RankDeaths.first`); the
    others were then stopped by the launcher, not dead of their own accord. `statuses`: the wait status
    of the ranks whose exit was seen in time (`RankDeaths.status`). `interrupted`: `ddpdoctor run` was sent
    SIGINT, SIGTERM, SIGHUP or SIGQUIT and passed it on; what the ranks reported stands, nothing is judged
    after.
    `outlived`: the ranks still running when the main process was gone, stopped by `ddpdoctor run` itself.
    """
    findings = with_ranks(collect_findings(run_dir), run_dir)
    records = records_from_run_dir(run_dir)
    new: list[Finding] = []
    if not RunDir(run_dir).has(Mark.REPORTED) and rc != 0 and records and not interrupted:
        records, finding = _judged_after_the_fact(records, findings, died_before_the_rest, statuses, outlived)
        if finding is not None:
            findings.insert(0, finding)
            new.append(finding)
    _print_report(options, run_dir, findings, new)
    if options.report_dir:
        try:
            write_report_dir(options.report_dir, findings, records)
        except OSError as exc:  # the job's exit code is still the one to return
            print(f"[ddpdoctor] could not write the report into {options.report_dir}: {exc}", file=sys.stderr)
    if not records and not interrupted and distributed_launcher(options.command):
        print(f"[ddpdoctor] no process group was formed in this job{no_group_cause(options.command)}",
              file=sys.stderr, flush=True)
    _print_recap(options, findings, records)
    return _exit_code(options, rc, findings, new)


def _print_recap(options: RunOptions, findings: list[Finding], records: Mapping[int, RankRecord]) -> None:
    """The verdict again, as the last lines of the job's output (guard/launch/recap.py)."""
    report = RunDir(options.report_dir).report if options.report_dir else None
    recap = recap_of(findings, records, report)
    if recap is None:
        return
    try:
        lines = recap_lines(recap, distributed_launcher(options.command))
        print("\n".join(lines), file=sys.stderr, flush=True)
    except OSError:  # the terminal is gone (SIGHUP): the report files still hold it
        pass


def _judged_after_the_fact(
    records: dict[int, RankRecord],
    findings: list[Finding],
    died_before_the_rest: set[int] | None,
    statuses: dict[int, int] | None,
    outlived: set[int] | None,
) -> tuple[dict[int, RankRecord], Finding | None]:
    """A failed job nobody reported on: the records as the launcher saw the ranks end, and the verdict on
    them, if there is one."""
    world = max(records) + 1
    if failed_alike(records, world):
        return records, None
    first = died_before_the_rest or set()
    if any(r in records and (records[r].state is RankState.EXITED or records[r].gave_up) for r in first):
        first = set()  # the first to go left on its own (at its end, or by `sys.exit`): no death to blame
    first = first or raised_alone(records)
    records = {rank: _as_seen(record, (statuses or {}).get(rank),
                              bool((first and rank not in first) or rank in (outlived or set())))
               for rank, record in records.items()}
    # dead=set(): a rank that died first may itself have been the one waiting (gloo aborts a rank on a
    # size mismatch), so every rank with a collective in progress is judged.
    verdict = decide(records, world, dead=set(), grace=0.0, hang_after=float("inf"))
    if verdict is None and first and not any(f.severity == Severity.ERROR for f in findings):
        # Nobody waited: the launcher stopped the others first. The rank that went first is still the
        # job's failure (its traceback scrolls by in the log, among the launcher's own), unless a
        # rank's own error finding (F1's, raised by the guard) already says why it died.
        verdict = died_first(records, world, first)
    return records, verdict.finding() if verdict is not None else None


def _print_report(options: RunOptions, run_dir: str, findings: list[Finding], new: list[Finding]) -> None:
    """A rank that reported may have been stopped (torchrun's SIGTERM) before it finished printing: its
    files are there, and the report is printed from them here. Errors get a panel; warnings (the audits')
    were printed as one line by the rank that found them, and are in the summary."""
    panels: list[Finding] = []
    if not RunDir(run_dir).has(Mark.PRINTED):
        panels = [f for f in findings if f not in new and f.severity is Severity.ERROR] + new
        if panels:
            try:
                render(panels)
            except OSError:  # the terminal is gone (SIGHUP): the files still get the report
                pass
    if any(f.severity is not Severity.ERROR for f in findings):
        shown = panels if panels else [f for f in findings if f.severity is Severity.ERROR]
        report_path = RunDir(options.report_dir).report if options.report_dir else None
        try:
            render_summary(findings, shown=shown, report_path=report_path)
        except OSError:
            pass


def _exit_code(options: RunOptions, rc: int, findings: list[Finding], new: list[Finding]) -> int:
    # a rank's own exception is the job's failure, only named here: its exit code stays the job's
    named_only = rc != 0 and any(f.facts.get("kind") == Decision.RAISED_FIRST.value for f in new)
    if not named_only and any(f.severity == Severity.ERROR for f in findings):
        return 1
    if rc < 0:
        return 128 - rc
    if rc == 0 and findings and options.strict:  # warnings leave the exit code alone, unless asked
        return 1
    return rc


def raised_alone(records: Mapping[int, RankRecord]) -> set[int]:
    """The ranks that died of an uncaught exception (not of a collective another death broke) when no
    other rank has an error of its own or finished: the order of the deaths was not seen (the watcher
    woke after both), but only one side had something to die of; the others were stopped."""
    raised = {r for r, record in records.items() if record.state is RankState.DEAD and record.error
              and not record.gave_up and not died_of_a_failed_collective(record)}
    others = [record for r, record in records.items() if r not in raised]
    if (
        raised
        and others
        and all(
            record.state is not RankState.EXITED and (not record.error or died_of_a_failed_collective(record))
            for record in others
        )
    ):
        return raised
    return set()


_LAUNCHERS = frozenset({"torchrun", "accelerate", "accelerate-launch", "deepspeed", "torch.distributed.run",
                        "torch.distributed.launch"})


def distributed_launcher(command: list[str]) -> bool:
    """Whether the command starts a multi-process launcher, whose job is expected to form a process group.
    A plain `python tool.py` is not: a job that never meant to be distributed is left silent."""
    return any(os.path.basename(word) in _LAUNCHERS for word in command[:4])


def no_group_cause(command: list[str]) -> str:
    """The launcher's likely reason a job formed no process group, where the command shows it; else what
    it means."""
    words = [os.path.basename(word) for word in command]
    if "accelerate" in words or "accelerate-launch" in words:
        if "--cpu" in command and "--multi_gpu" not in command:
            return (
                ": `accelerate launch --cpu` starts one process whatever --num_processes says; for several "
                "ranks on CPU use `accelerate launch --multi_gpu --num_processes N` with "
                "`Accelerator(cpu=True)`"
            )
    return (": no process called init_process_group (or every one failed before it), so the guard had no "
            "ranks to watch")


def _as_seen(record: RankRecord, status: int | None, stopped_by_someone: bool) -> RankRecord:
    """A rank's record with what the launcher saw: its wait status, no wait (the job is over), and whether
    the launcher stopped it. A rank with an error of its own died of it, stopped or not; one whose error is
    the collective the dead rank broke ("Connection reset by peer") was a victim the launcher then stopped."""
    record = replace(record, exit_status=status if status is not None else record.exit_status,
                     waited=0.0 if record.current is not None else record.waited)
    if stopped_by_someone and record.state is RankState.DEAD and (
        not record.error or died_of_a_failed_collective(record)
    ):
        record = replace(record, state=RankState.STOPPED)
    return record


def write_report_dir(report_dir: str, findings: list[Finding], records: Mapping[int, RankRecord]) -> None:
    """report.json, and rank-<r>.jsonl for every rank that did not write its own (a dead rank's, from its
    flight file)."""
    write_report(report_dir, findings)
    for name in os.listdir(report_dir):
        if name.startswith("report.json.tmp"):  # a rank stopped (SIGTERM by torchrun) mid-write
            try:
                os.unlink(os.path.join(report_dir, name))
            except OSError:
                pass
    for rank, record in records.items():
        target = os.path.join(report_dir, f"rank-{rank}.jsonl")
        if not os.path.exists(target) and record.flight:
            write_rank_log(report_dir, rank, read_flight(record.flight))
