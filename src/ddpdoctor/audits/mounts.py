"""Which filesystem holds a path, and whether other hosts may see the same file there (from /proc/mounts).

Two ranks on different hosts that write `/ckpt/last.pt` write two files on two local disks, but one file on
NFS, Lustre, GPFS, BeeGFS, CIFS or a FUSE network mount. Only the mount type tells them apart; it cannot
tell whether those hosts mount the same export, so what is said about it is hedged."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

# Types whose files other hosts may share. fuse.* (sshfs, juicefs, gcsfuse, s3fs...) is matched by prefix.
SHARED_TYPES = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "wekafs",
        "panfs", "orangefs", "afs", "9p", "virtiofs", "fuse",
    }
)


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str

    @property
    def shared(self) -> bool:
        return self.fstype in SHARED_TYPES or self.fstype.startswith("fuse.")


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as \040, \011, \012, \134
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts.append(Mount(_unescape(fields[1]), fields[2], _unescape(fields[0])))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding the absolute `path`: the longest mount point it is under (the last one mounted
    there, when one mount hides another)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        if (path == point or path.startswith(point if point == "/" else point + "/")) and (
            best is None or len(point) >= len(best.point.rstrip("/") or "/")
        ):
            best = mount
    return best


@functools.lru_cache(maxsize=1)
def _table() -> tuple[Mount, ...]:
    # read once per process: a job's checkpoint directories do not move between mounts while it runs
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as handle:
            return tuple(parse_mounts(handle.read()))
    except OSError:
        return ()


def filesystem_of(path: str) -> Mount | None:
    """The mount holding `path` on this host (None where /proc/mounts cannot be read)."""
    return mount_of(os.path.abspath(path), list(_table()))
