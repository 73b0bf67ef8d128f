"""The guard's settings, from `install(...)` arguments or from the environment `ddpdoctor run` sets."""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_ACTIVE = "DDPDOCTOR_GUARD"
ENV_HANG_AFTER = "DDPDOCTOR_HANG_AFTER"
ENV_SLOW_AFTER = "DDPDOCTOR_SLOW_AFTER"
ENV_REPORT_DIR = "DDPDOCTOR_REPORT_DIR"
ENV_REMEDY = "DDPDOCTOR_REMEDY"
ENV_HEARTBEAT = "DDPDOCTOR_HEARTBEAT"
ENV_RUN_DIR = "DDPDOCTOR_RUN_DIR"  # where ranks leave flight files and findings for the launcher
ENV_DEBUG = "DDPDOCTOR_DEBUG"  # say why a swallowed exception was swallowed
ENV_STOP_ALWAYS = "DDPDOCTOR_STOP_ALWAYS"  # stop on every verdict, also one the program handles
ENV_DIGEST_INTERVAL = "DDPDOCTOR_DIGEST_INTERVAL"  # --digest-every, read by audits/replica_points.py

DEFAULT_HANG_AFTER = 300.0
DEFAULT_SLOW_AFTER = 60.0


def scratch_dir() -> str:
    """Where flight files go: tmpfs when there is one. A page of a disk-backed file that is being written
    back cannot be rewritten until the write-back finishes (stable pages), which stalls the hot path's
    `pwrite` for hundreds of microseconds; tmpfs pages are never written back."""
    import tempfile

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()
DEFAULT_HEARTBEAT = 0.5


@dataclass
class GuardConfig:
    hang_after: float = DEFAULT_HANG_AFTER
    # a rank running alone this long while its peers wait gets a note (single-rank-long-section); None:
    # 60 s, or --hang-after where that is lower (a wait the user asked to hear about)
    slow_after: float | None = None
    report_dir: str | None = None
    remedy: bool = False
    heartbeat: float = DEFAULT_HEARTBEAT
    # How long a rank waits in a collective before its monitor asks the others (collectives are usually
    # far shorter; a slow one only costs a few store reads).
    grace: float = 0.75
    ring_size: int = 256
    run_dir: str | None = None
    # Under `ddpdoctor run` (its run directory given): the launcher reads the run directory back and
    # prints the report from it; outside it, only --report gets files and a rank cleans up after itself.
    launched: bool = False
    debug: bool = False
    restart: str = "0"  # torchelastic's restart count: each restart of the job has its own store keys
    # Stop the job also where the program handles the failure itself (monitored_barrier, a caught error);
    # by default those are reported only (rank/stop_policy.py).
    stop_always: bool = False

    @property
    def note_slow_after(self) -> float:
        return self.slow_after if self.slow_after is not None else min(DEFAULT_SLOW_AFTER, self.hang_after)

    @property
    def dead_after(self) -> float:
        """Silence after which a peer counts as dead: bounded by hang_after, never below a few heartbeats."""
        return max(4 * self.heartbeat, min(self.hang_after, 30.0))

    @classmethod
    def from_env(cls) -> GuardConfig:
        def number(name: str, default: float) -> float:
            try:
                return float(os.environ[name])
            except (KeyError, ValueError):
                return default

        return cls(
            hang_after=number(ENV_HANG_AFTER, DEFAULT_HANG_AFTER),
            slow_after=number(ENV_SLOW_AFTER, -1.0) if ENV_SLOW_AFTER in os.environ else None,
            report_dir=os.environ.get(ENV_REPORT_DIR) or None,
            remedy=os.environ.get(ENV_REMEDY, "") not in ("", "0"),
            heartbeat=number(ENV_HEARTBEAT, DEFAULT_HEARTBEAT),
            run_dir=os.environ.get(ENV_RUN_DIR) or None,
            launched=bool(os.environ.get(ENV_RUN_DIR)),
            debug=debug_enabled(),
            restart=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
            stop_always=os.environ.get(ENV_STOP_ALWAYS, "") not in ("", "0"),
        )


def debug_enabled() -> bool:
    return os.environ.get(ENV_DEBUG, "") not in ("", "0")
