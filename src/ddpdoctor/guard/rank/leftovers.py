"""Flight files that no process will read again: swept when a later job installs the guard.

A process guarded by `install()` alone removes its flight and meta files at exit, unless it ends in
`os._exit` or is killed, and then they stay in tmpfs (64 KB a rank) until reboot. `ddpdoctor run`'s
own run directories are not touched here: the launcher removes them itself, and reads them *after* its
ranks are dead, so "every rank is dead" does not mean "nobody will read this".
"""

from __future__ import annotations

import json
import os
import shutil
import time

from ..host import pid_alive, this_host

STALE_AFTER = 6 * 3600.0  # untouched this long: a live job's flight file is written at every collective


def _abandoned(path: str, now: float, host: str) -> bool:
    """Whether a job directory's files are all old and every rank that wrote there is gone from this host."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return False
    for entry in entries:
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER:
                return False
        except OSError:
            return False
        if entry.name.startswith("rank-") and entry.name.endswith(".meta.json"):
            try:
                with open(entry.path, encoding="utf-8") as handle:
                    meta = json.load(handle)
                if meta.get("host") != host or pid_alive(int(meta["pid"])):
                    return False  # another host's (a shared /dev/shm), or still running
            except (OSError, ValueError, KeyError, TypeError):
                return False
    return True


def sweep(scratch: str, keep: str | None = None, now: float | None = None) -> list[str]:
    """Remove this user's abandoned job directories under `scratch`: `ddpdoctor-<uid>/<job>-<port>/` and
    `ddpdoctor-rank<r>-*` (jobs without MASTER_PORT). Returns what was removed."""
    now = time.time() if now is None else now
    host = this_host()
    uid = os.getuid()
    candidates: list[str] = []
    shared = os.path.join(scratch, f"ddpdoctor-{uid}")
    try:
        candidates += [entry.path for entry in os.scandir(shared) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        pass
    try:
        for entry in os.scandir(scratch):
            if entry.name.startswith("ddpdoctor-rank") and entry.is_dir(follow_symlinks=False):
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    candidates.append(entry.path)
    except OSError:
        pass
    removed = []
    for path in candidates:
        if keep is not None and os.path.abspath(path) == os.path.abspath(keep):
            continue
        if _abandoned(path, now, host):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
