"""Facts about this host's process table: which host a pid belongs to, whether a process lives, how it
ended, whether this process hosts the store. Linux's /proc where it says more than `kill(pid, 0)`."""

from __future__ import annotations

import os
from typing import Any

from ..failsafe import attempt


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None


_host: str | None = None


def this_host() -> str:
    """Where a pid means this process table: the host name, the kernel's boot id (containers on two
    machines may share a host name) and the pid namespace (containers on one machine may too). Records
    and files carry it; a pid is looked up only in a record that carries ours."""
    global _host
    if _host is None:
        import socket  # here: `ddpdoctor run` starts the job before it asks

        parts = [socket.gethostname()]
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
                parts.append(handle.read().strip()[:8])
            parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
        except OSError:  # no /proc (macOS): the host name is all there is
            pass
        _host = "/".join(parts)
    return _host


def environment_of(pid: int) -> dict[str, str] | None:
    """A process's environment as it started (/proc/<pid>/environ); None where unreadable (gone, another
    user's, no /proc)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def all_pids() -> list[int]:
    """Every process of this pid namespace (empty without /proc)."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = proc_stat(pid)  # a zombie (exited, not yet reaped by its parent) is gone for our purposes
    return not fields or fields[0] != "Z"


def process_stopped(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP, Ctrl-Z, a debugger's trace stop)."""
    fields = proc_stat(pid)
    return fields is not None and fields[:1] in (["T"], ["t"])


def zombie_status(pid: int) -> int | None:
    """The wait status of an exited process its parent has not reaped yet (`exit_code` in
    /proc/<pid>/stat, Linux 3.5+); None once reaped, or where /proc does not say."""
    fields = proc_stat(pid)
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    try:
        return int(fields[-1])
    except ValueError:
        return None


def hosts_store(store: Any) -> bool:
    """Whether this process listens on the store's port: one of its descriptors is a listening TCP socket
    bound to that port. Not read from /proc/net/tcp, which the kernel makes by walking its whole socket
    table: 5 ms of CPU a read on a busy host, in every rank's exit."""
    number = attempt("host.hosts_store: not a TCPStore", lambda: int(store.port), None)
    if number is None:
        return False
    import socket
    import stat

    listening = getattr(socket, "SO_ACCEPTCONN", None)
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return False
    for fd in fds:
        try:
            if listening is None or not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            copy = os.dup(fd)  # a socket object of its own: closing it leaves the process's descriptor open
        except OSError:  # closed meanwhile, or listdir's own descriptor
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            continue
        with sock:
            try:
                if (
                    sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.getsockopt(socket.SOL_SOCKET, listening)
                    and sock.getsockname()[1] == number
                ):
                    return True
            except OSError:
                continue
    return False
