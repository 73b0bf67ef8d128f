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
import threading
import time
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from .. import config as cfg
from ..host import pid_alive, this_host, zombie_status
from ..protocol import Mark, RunDir, read_json

# What judges and reports a job once it is over (findings, verdicts, the renderer: most of what `ddpdoctor
# run` imports) is imported on a thread of its own while the job starts, not before: the job's start
# does not wait for it.
CONCLUSION = "ddpdoctor.guard.launch.conclusion"

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
        # When the job's main process was seen gone (the wake-up that saw it): a rank seen gone in the same
        # wake-up or later cannot be ordered before it (`first`).
        self.main_gone_at: float | None = None
        self._main_pid: int | None = None

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
        self._main_pid = proc.pid
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
                    self.main_gone_at = now
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
            from ...records import RankMeta

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
        # A rank seen gone with the main process (torchrun's agent, not itself a rank) in one wake-up: which
        # went first is unknown, and an agent killed from outside (the OOM killer) takes its workers' store
        # down with it, so the ranks end after it. Not a rank that took the job down.
        if self.main_gone_at is not None and self._main_pid not in self.pids.values():
            stopped |= {r for r, t in self.gone_at.items() if t >= self.main_gone_at}
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
    started = time.time()
    try:
        proc = subprocess.Popen(options.command, env=guarded_env(options, run_dir), start_new_session=True)
    except OSError as exc:
        raise CommandNotStarted(options.command[0], exc) from exc
    pgid = proc.pid
    signals.started(pgid)
    preparing = _Preparation(options.report_dir, started)
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
    conclusion = preparing.done()
    return conclusion.conclude(options, run_dir, rc, deaths.first(), deaths.status,
                               interrupted=bool(signals.received), outlived=outlived)


class _Preparation(threading.Thread):
    """Done while the job starts, on a thread of its own: importing what judges and reports the job, and
    removing what an earlier run left in a reused report directory (only files older than this job: what
    its ranks write meanwhile stays)."""

    def __init__(self, report_dir: str | None, started: float) -> None:
        super().__init__(name="ddpdoctor-prepare", daemon=True)
        self.report_dir = report_dir
        self.started = started
        self.module: Any = None
        self.start()

    def run(self) -> None:
        try:
            self.module = self._prepare()
        except Exception:  # noqa: BLE001 - done again by `done`, on the main thread, where its error shows
            pass

    def _prepare(self) -> Any:
        import importlib

        from ..report import clear_previous

        if self.report_dir:
            clear_previous(self.report_dir, older_than=self.started)
        return importlib.import_module(CONCLUSION)

    def done(self) -> Any:
        """The conclusion module, once the preparation is over."""
        self.join()
        return self.module if self.module is not None else self._prepare()


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
