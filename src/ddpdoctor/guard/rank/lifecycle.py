"""A process's default group coming and going: the guard starts when `init_process_group` returns (the
flight file, the fault log, the monitor), stops its monitor at `destroy_process_group`, and starts over for a
later group (new history, chain and store keys)."""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from ..config import scratch_dir
from ..protocol import RunDir
from . import fault_log
from .consensus import ChainCheck
from .flight import FlightFile
from .lightning_metrics import wrap_log_if_imported

if TYPE_CHECKING:
    from .runtime import GuardRuntime

FLIGHT_SLOTS = 64  # 64 KB per rank: what a dead rank's rank-<r>.jsonl can show


def group_ready(runtime: GuardRuntime) -> None:
    """Called once the default process group exists (at install, or when init_process_group returns)."""
    if runtime.disabled or (runtime.rank is not None and not runtime.left_group):
        return
    if runtime.left_group:
        _start_over(runtime)
    with runtime.failing_open():
        import threading

        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not dist.is_initialized():
            return
        runtime.default_group = c10d._get_default_group()
        # Known from the start, so that every record carries its sequence number, also from a rank
        # whose collectives all come from C++ (DDP) until it dies.
        runtime.info(runtime.default_group)
        runtime.rank = dist.get_rank()
        runtime.world_size = dist.get_world_size()
        runtime.main_thread_id = threading.main_thread().ident
        runtime.hold_fast_path()  # plans made for another default group
        runtime.pid = os.getpid()
        runtime.chain.rank = runtime.rank
        if runtime.run_dir is None:
            runtime.run_dir = tempfile.mkdtemp(prefix=f"ddpdoctor-rank{runtime.rank}-", dir=scratch_dir())
            runtime.own_run_dir = True
        os.makedirs(runtime.run_dir, exist_ok=True)
        if runtime.rank == 0 and runtime.config.report_dir and not runtime.config.launched:
            # install() on its own (`ddpdoctor run` clears the directory before the job starts)
            from ..report import clear_previous

            clear_previous(runtime.config.report_dir, older_than=runtime.started)
        files = RunDir(runtime.run_dir)
        runtime.flight = FlightFile(files.flight(runtime.rank), min(runtime.config.ring_size, FLIGHT_SLOTS))
        fault_log.enable(files.fault_log(runtime.rank))
        wrap_log_if_imported()
        from ...audits.hooks import install_all
        from .audit_context import RankAuditContext

        install_all(RankAuditContext(runtime))
        from .monitor import RankMonitor

        runtime.monitor = RankMonitor(runtime)
        runtime.monitor.start()
        from .. import register_exit_hook

        register_exit_hook()

def group_destroyed(runtime: GuardRuntime) -> None:
    if runtime.monitor is not None:
        runtime.monitor.stop(exited=True)
    if runtime.job is not None:  # the job's log now: a later group of this process starts a new history
        from .publish import write_own_log

        write_own_log(runtime)
    # Rank and history stay for the exit record and rank log; a later init_process_group starts over.
    runtime.left_group = True

def _start_over(runtime: GuardRuntime) -> None:
    """A new default group after destroy_process_group: nothing of the old one may be compared with it
    (its sequence numbers start again at 0, under the same group names), so its history, chain and
    store keys go."""
    runtime.left_group = False
    runtime.generation += 1
    runtime.groups.clear()
    runtime.by_line.clear()
    runtime.hold_fast_path()
    runtime.default_group = None
    runtime.ring.clear()
    runtime.current = None
    runtime.side.clear()
    runtime.pending.clear()
    runtime.chain = ChainCheck(0)
    runtime.renumbering = None
    runtime.paused = None
    runtime.job = None
    runtime.monitor = None
    if runtime.flight is not None:
        runtime.flight.close()
        runtime.flight = None
    runtime.rank = None
