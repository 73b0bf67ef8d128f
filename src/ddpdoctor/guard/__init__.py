"""The runtime guard: `install()` it in a training process (or let `ddpdoctor run` do it in every process).

Works before or after `torch` / `torch.distributed` are imported and before or after
`init_process_group`: until torch.distributed is imported, an import hook waits for it (torch is never
imported by the guard itself); until the default process group exists, `init_process_group` is wrapped
and the monitor starts when it returns. See docs/guard.md.

`ddpdoctor run` installs the guard in every Python its job starts, most of which never touch
torch.distributed (a tool the training script shells out to, the launcher's helpers): until that import
only this module and the settings are loaded; the rank's machinery comes with torch.distributed.
"""

from __future__ import annotations

import atexit
import functools
import importlib.machinery
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ..failsafe import failsafe
from .config import DEFAULT_HEARTBEAT, GuardConfig

if TYPE_CHECKING:
    from ..audits.context import AuditContext
    from .rank.runtime import GuardRuntime

__all__ = ["install", "uninstall", "is_installed", "current_runtime", "audit_context"]

_config: GuardConfig | None = None  # set by install(); the runtime is made from it when first needed
_process_started = 0.0  # wall clock; what an install() on its own clears a report directory of
_runtime: GuardRuntime | None = None
_finder: Any = None
_lifecycle_originals: dict[str, Any] = {}


def install(
    *,
    hang_after: float | None = None,
    report_dir: str | None = None,
    remedy: bool = False,
    heartbeat: float = DEFAULT_HEARTBEAT,
    slow_after: float | None = None,
) -> None:
    """Guard this process's torch.distributed collectives. A second call (or a call in a program that
    `ddpdoctor run` already guards) changes the running guard's settings to the arguments it gives."""
    global _config, _process_started
    config = GuardConfig.from_env() if _config is None else _config
    if hang_after is not None:
        config.hang_after = float(hang_after)
    if slow_after is not None:
        config.slow_after = float(slow_after)
    if report_dir is not None:
        config.report_dir = os.path.abspath(report_dir)
    config.remedy = config.remedy or remedy
    if heartbeat != DEFAULT_HEARTBEAT:
        config.heartbeat = float(heartbeat)
    if _config is not None:
        return  # the running guard (the monitor reads these settings at every heartbeat)
    if config.run_dir is None:
        config.run_dir = _default_run_dir()
    _config, _process_started = config, _process_start_time()
    if "torch.distributed" in sys.modules:
        _activate()
    else:
        _await_torch_distributed()


def _made_runtime() -> GuardRuntime | None:
    """The guard's runtime in this process, made on first need (torch.distributed imported, or asked for):
    a process that never imports torch.distributed never loads it."""
    global _runtime
    if _runtime is None and _config is not None:
        from .rank.runtime import GuardRuntime

        _runtime = GuardRuntime(_config)
        # Rank 0 clears the report directory of what is older than this, when the group is ready; not its
        # install() time: another rank may have added a finding to report.json before rank 0 installed.
        _runtime.started = _process_started
        atexit.register(_at_exit)
    return _runtime


def uninstall() -> None:
    """Remove every patch and stop the monitor (for tests)."""
    global _runtime, _finder, _config
    runtime, _runtime, _config = _runtime, None, None
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
    if runtime is None:
        return
    from .rank import intercept, lightning_metrics

    intercept.set_runtime(None)
    intercept.unpatch()
    _unpatch_lifecycle()
    if getattr(sys.exit, "__ddpdoctor__", False):
        sys.exit = sys.exit.__wrapped__  # type: ignore[attr-defined]
    lightning_metrics.unwrap()
    from ..audits.hooks import uninstall_all

    uninstall_all()
    if runtime.monitor is not None:
        runtime.monitor.stop(exited=False)
    runtime.remove_files()
    atexit.unregister(_at_exit)


def is_installed() -> bool:
    return _config is not None


def current_runtime() -> GuardRuntime | None:
    return _made_runtime()


def audit_context() -> AuditContext | None:
    """What an audit that the guard did not install (the Lightning callback's) may ask of the guard in this
    process: the same `AuditContext` the guard hands its own runtime audits (a finding kept with the rank's,
    for report.json), never the runtime itself; None where no guard is installed."""
    runtime = _made_runtime()
    if runtime is None:
        return None
    from .rank.audit_context import RankAuditContext  # here: not on the start path of every process

    return RankAuditContext(runtime)


def _process_start_time() -> float:
    """When this process started, on the wall clock (from /proc on Linux; now where that cannot be read).
    No rank of a job writes before the rendezvous, which waits for every rank's process, rank 0's too."""
    now = time.time()
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            # the command name (field 2) may hold spaces and parentheses: count fields after its last ')'
            start_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return now
    # btime is whole seconds: up to 1 s early, which keeps a file at most 1 s older than this process
    return min(now, boot + start_ticks / os.sysconf("SC_CLK_TCK"))


def _default_run_dir() -> str | None:
    """Where this job's ranks leave flight files: a path every rank of the job on this host derives alike."""
    from .config import scratch_dir

    port = os.environ.get("MASTER_PORT")
    if not port:
        return None  # decided per process once the group exists (see GuardRuntime.group_ready)
    job = os.environ.get("TORCHELASTIC_RUN_ID") or "job"
    return os.path.join(scratch_dir(), f"ddpdoctor-{os.getuid()}", f"{job}-{port}")


def _activate() -> None:
    if _is_torchrun_agent():
        return
    runtime = _made_runtime()
    if runtime is None:
        return
    with runtime.failing_open():
        import torch.distributed as dist

        if not dist.is_available():
            return
        from .rank import intercept

        intercept.patch(also=_patch_lifecycle())  # one walk of sys.modules rebinds both
        intercept.set_runtime(runtime)
        if dist.is_initialized():
            runtime.group_ready()


_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _is_torchrun_agent() -> bool:
    """torchrun's own process (the agent that starts the ranks and makes no process group of its own): it
    imports torch.distributed before it starts the ranks, and anything the guard did there would delay the
    job's start. Each rank is a Python of its own, guarded there."""
    argv = getattr(sys, "orig_argv", sys.argv)  # argv[0] is still "-m" while `python -m` imports the package
    words = argv[: argv.index("-m") + 2] if "-m" in argv else argv[:1]
    return os.path.basename(sys.argv[0]) == "torchrun" or any(word in _TORCHRUN_MODULES for word in words)


class _TorchDistributedFinder:
    """Activates the guard right after `torch.distributed` has been executed, without importing torch. A
    meta path finder is any object with `find_spec` (importlib.abc's base class would cost every guarded
    Python the import of importlib.resources)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch.distributed":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _activate()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _await_torch_distributed() -> None:
    global _finder
    _finder = _TorchDistributedFinder()
    sys.meta_path.insert(0, _finder)


def _patch_lifecycle() -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Wrap init/destroy_process_group in torch.distributed; the originals and their wrappers by name, for
    the caller to rebind where other modules hold them (None when already wrapped)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if _lifecycle_originals:
        return None
    init = c10d.init_process_group
    destroy = c10d.destroy_process_group

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        watch = _watch_join(init, args, kwargs)
        try:
            result = init(*args, **kwargs)
        finally:
            if watch is not None:
                watch.finish()
        if _runtime is not None:
            _runtime.group_ready()
        return result

    @functools.wraps(destroy)
    def destroy_process_group(group: Any = None) -> Any:
        if _runtime is not None and (group is None or group is _runtime.default_group):
            _runtime.group_destroyed()
        return destroy(group)

    _lifecycle_originals.update(init_process_group=init, destroy_process_group=destroy)
    wrappers: dict[str, Any] = {
        "init_process_group": init_process_group,
        "destroy_process_group": destroy_process_group,
    }
    for name, wrapper in wrappers.items():
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)
    return dict(_lifecycle_originals), wrappers


def _watch_join(init: Any, args: tuple, kwargs: dict) -> Any:
    """A JoinWatch for this `init_process_group` call (see joining.py), or None."""
    runtime = _runtime
    if runtime is None or runtime.disabled:
        return None
    # a bad argument is torch's to refuse, with its own error
    with failsafe("guard: no watch on init_process_group"):
        from .rank.joining import JoinWatch, attempt_from_call, user_frame

        attempt = attempt_from_call(init, args, kwargs, os.environ, user_frame(sys._getframe(2)))
        launched = runtime.config.run_dir if runtime.config.launched else None
        watch = JoinWatch(attempt, runtime.config.hang_after, launched, runtime.config.report_dir)
        watch.start()
        return watch
    return None


def _unpatch_lifecycle() -> None:
    if not _lifecycle_originals:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from .rank import intercept

    current = {name: getattr(c10d, name) for name in _lifecycle_originals}
    for name, original in _lifecycle_originals.items():
        setattr(c10d, name, original)
        setattr(dist, name, original)
    intercept.rebind(current, dict(_lifecycle_originals))
    _lifecycle_originals.clear()


_exit_hook_registered = False


def register_exit_hook() -> None:
    """multiprocessing children (mp.spawn workers) leave through os._exit, skipping atexit; their
    finalizers still run, so the rank can say it exited (not died) and clean up. An uncaught exception
    first leaves an exit record (see `_excepthook`)."""
    global _exit_hook_registered
    if _exit_hook_registered:  # a process that makes a second default group
        return
    _exit_hook_registered = True
    with failsafe("__init__.register_exit_hook"):
        import multiprocessing.util

        multiprocessing.util.Finalize(None, _at_exit, exitpriority=100)
    _note_early_exits()
    if not getattr(sys.excepthook, "__ddpdoctor__", False):
        previous = sys.excepthook

        def hook(kind: Any, value: Any, traceback: Any) -> None:
            _excepthook(value)
            previous(kind, value, traceback)

        hook.__ddpdoctor__ = True  # type: ignore[attr-defined]
        sys.excepthook = hook


def _note_early_exits() -> None:
    """`sys.exit(3)` from the user's code is how a rank gives up, and no excepthook sees it: note it as
    the rank's fatal error, at the caller's line, so that its peers' report says it left with status 3
    there rather than that it "finished". A library's `sys.exit` (mp.spawn's wrapper after an exception,
    argparse) is not the user's decision and is left to the other exit paths."""
    original = sys.exit
    if getattr(original, "__ddpdoctor__", False):
        return

    def exit(status: Any = None) -> Any:  # noqa: A001 - it stands in for sys.exit
        runtime = _runtime
        if status not in (0, None) and runtime is not None and runtime.fatal is None:
            with failsafe("__init__: noting sys.exit"):
                from ..callsite import is_user

                if is_user(sys._getframe(1).f_code.co_filename):
                    try:
                        raise SystemExit(status)
                    except SystemExit as exiting:  # a traceback whose frame leads back to the caller
                        _excepthook(exiting)
        return original(status)

    exit.__ddpdoctor__ = True  # type: ignore[attr-defined]
    exit.__wrapped__ = original  # type: ignore[attr-defined]
    sys.exit = exit


def _excepthook(exc: BaseException) -> None:
    """A rank dying of an exception raised outside a guarded call (in `loss.backward()`, where DDP's
    gradient all_reduce runs from C++) says where it was and how far its groups' sequence numbers had
    got, in its run directory, at once: the launcher may SIGTERM it a moment later, and its last
    heartbeat is up to one interval old."""
    runtime = _runtime
    if runtime is None or runtime.pid != os.getpid() or runtime.rank is None:
        return
    with failsafe("__init__._excepthook"):  # never hide the user's traceback
        from .rank.own_record import write_exit_record

        runtime.fatal = exc  # the monitor's last record says the rank died of it, not that it finished
        write_exit_record(runtime, exc)


def _caught_by_process_wrapper() -> BaseException | None:
    """mp.spawn's `_wrap` catches a worker's exception, saves its text for the parent and calls
    `sys.exit(1)`, so no excepthook runs. multiprocessing runs its finalizers (this one among them) in
    a `finally` while that SystemExit is still propagating, and the SystemExit carries the exception
    it was raised over as its context."""
    exiting = sys.exc_info()[1]
    if not isinstance(exiting, SystemExit) or exiting.code in (0, None):
        return None
    cause = exiting.__context__
    return cause if isinstance(cause, Exception) else None


def _at_exit() -> None:
    runtime = _runtime
    if runtime is None or runtime.pid != os.getpid() or runtime.exited:
        return
    if runtime.rank is None and runtime.monitor is None:
        # never in a process group (torchrun's agent, a helper Python of the job): nothing to record
        runtime.exited = True
        with failsafe("__init__._at_exit: a process without a group"):
            runtime.remove_files()
        return
    caught = _caught_by_process_wrapper()
    if caught is not None and runtime.fatal is None:
        _excepthook(caught)
    runtime.exited = True
    with failsafe("__init__._at_exit"):  # never turn a clean exit into a traceback
        if runtime.monitor is not None:
            runtime.monitor.stop(exited=True, at_interpreter_exit=True)
        from .rank.own_record import write_exit_record

        if runtime.config.report_dir:  # its rank log; publish.py brings the report's renderer, 10-20 ms
            from .rank.publish import write_own_log

            write_own_log(runtime)
        if runtime.rank is not None and runtime.config.launched:
            write_exit_record(runtime, None)  # left on its own: `ddpdoctor run` must not count it as dead
        if runtime.config.report_dir and runtime.rank == 0:
            from .report import merge_report

            # the other ranks have added theirs as they found them; an empty list says "clean"
            merge_report(runtime.config.report_dir, list(runtime.findings))
        runtime.remove_files()
