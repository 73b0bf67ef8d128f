"""F10 checkpoint-race at run time: two or more ranks write the same file at the same point of the job.

Patched writers (once per save, never per collective): `torch.save` (and `torch.serialization.save`),
safetensors' `save_file` (through `safetensors.torch.serialize_file`, which it looks up at each call, so a
`from safetensors.torch import save_file` made before the guard started is seen too), and Lightning's
`TorchCheckpointIO.save_checkpoint` (Lightning `torch.save`s into a BytesIO and writes the bytes through
fsspec; a save into a buffer is not a write of a file and is let through). accelerate's `accelerator.save`,
`save_model` and `save_state` write through `torch.save` / `save_file`, from the main process only (once per
machine with `save_on_each_node=True`), except `save_state`'s GradScaler and stateful-dataloader files,
which every process writes to the same path: those are reported like any other.

"The same point" is the default group's sequence number: two writes between the same two collectives have
nothing that orders them, so they may overlap; a rank that saves every epoch, or saves after a barrier that
another rank's save precedes, is at another number. Each write appends one entry under a key made of the
path's scope (this host, or "shared" for a path on a network filesystem), its real path and that number, in
the job's store; the rank whose entry makes the second distinct writer is the one that reports, so one
finding comes out whatever the timing, naming every writer its store read saw after its own write.
Each rank writing its own path (sharded checkpoints, `torch.distributed.checkpoint`, which writes through
file objects) never shares a key. The file's bytes are not touched: the original writer runs unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..callsite import classify, is_user
from ..failsafe import failsafe
from ..findings import Evidence, Finding, Fix, Location, Severity
from .announce import Announcer
from .context import AuditContext, AuditStore, StoreClient
from .mounts import Mount, filesystem_of
from .patching import Uninstall, all_of, patch

# A job that writes many files per rank (a data preprocessing pass) stops being audited after this many
# saves per process: every audited save leaves a key in the job's store.
MAX_AUDITED_SAVES = 4096
STORE_TIMEOUT_S = 10.0

# the entries one key holds: the rank's writes at one point of the job
_SEPARATOR = "\n"


@dataclass(frozen=True)
class Write:
    """One rank's write of a path, as its entry in the store says it."""

    rank: int
    host: str
    writer: str  # "torch.save", "safetensors save_file", "Lightning TorchCheckpointIO"
    path: str | None = None  # the user's line that led to it
    line: int | None = None
    library: str | None = None  # the library frame that called the writer ("accelerate", ...)
    library_site: str | None = None

    def encode(self) -> str:
        return json.dumps(
            [self.rank, self.host, self.writer, self.path, self.line, self.library, self.library_site],
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> Write | None:
        try:
            rank, host, writer, path, line, library, library_site = json.loads(text)
            return cls(int(rank), str(host), str(writer), path, line, library, library_site)
        except (ValueError, TypeError):
            return None

    @property
    def site(self) -> str:
        return f"{self.path}:{self.line}" if self.path else "(no line of the program on the stack)"


@dataclass(frozen=True)
class PendingReport:
    """What the reporting rank knows before its own write; completed from the store after it."""

    key: str
    target: str
    mount: Mount | None
    sequence: int
    me: Write


def target_path(target: Any) -> str | None:
    """The file a save writes, for a path argument; None for a buffer or an open file object (their writer
    chose the file: `torch.distributed.checkpoint` writes each rank's own through them)."""
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if not isinstance(target, str) or not target:
        return None
    if "://" in target and not target.startswith("file://"):
        return None  # object storage: each PUT replaces the object whole
    return target.removeprefix("file://")


def distinct_writers(writes: list[Write]) -> list[Write]:
    """Each rank's first write, in the order the store took them."""
    seen: set[int] = set()
    out = []
    for write in writes:
        if write.rank not in seen:
            seen.add(write.rank)
            out.append(write)
    return out


def is_reporter(writes: list[Write], rank: int) -> bool:
    """Whether `rank`'s entry, its only one under this key, made the second distinct writer."""
    mine = [w for w in writes if w.rank == rank]
    order = [w.rank for w in distinct_writers(writes)]
    return len(mine) == 1 and len(order) >= 2 and order[1] == rank


def race_finding(pending: PendingReport, writes: list[Write]) -> Finding:
    writers = sorted(distinct_writers(writes), key=lambda w: w.rank)
    ranks = [w.rank for w in writers]
    ranks_text = ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"
    hosts = sorted({w.host for w in writers})
    shared = pending.mount is not None and pending.mount.shared and len(hosts) > 1
    kinds = sorted({w.writer for w in writers})
    message = f"ranks {ranks_text} write `{pending.target}` at the same point of the job"
    message += f" (through {', '.join(kinds)}, with no collective between their writes)"
    if shared and pending.mount is not None:
        message += (
            f"; the file is on a {pending.mount.fstype} mount ({pending.mount.point}) from hosts "
            f"{', '.join(hosts)}: if these hosts mount the same export, they write one file"
        )
    symptom = (
        "`SafetensorError: Error while deserializing header`"
        if kinds == ["safetensors save_file"]
        else "`PytorchStreamReader failed reading zip archive`"
    )
    message += (
        "; concurrent writers of one file can leave it truncated or interleaved, which shows only when it is "
        f"loaded ({symptom})"
    )
    libraries = sorted({f"{w.library} ({w.library_site})" for w in writers if w.library and w.library_site})
    if libraries:
        message += f". The write is made by {', '.join(libraries)}, called from the program's line"
    evidence = [
        Evidence(
            f"rank {w.rank} on {w.host}: {w.writer} from {w.site}"
            + (f" via {w.library} {w.library_site}" if w.library else ""),
            rank=w.rank,
        )
        for w in writers
    ]
    locations = tuple(Location(w.path, w.line, rank=w.rank) for w in writers if w.path)
    return Finding(
        class_="checkpoint-race",
        message=message + ".",
        severity=Severity.WARNING,
        locations=locations,
        fix=Fix(
            "Write from global rank 0 only (`if dist.get_rank() == 0:`; Lightning: `if "
            "self.trainer.is_global_zero:`; accelerate: `accelerator.save(...)`), write to `path + '.tmp'` "
            "and `os.replace` it, and `dist.barrier()` "
            "before any rank reads it; per-rank state goes to a per-rank file name."
        ),
        evidence=tuple(evidence),
        facts={
            "path": pending.target,
            "writer_ranks": ranks,  # not "ranks": that names a verdict's per-rank rows in report.json
            "hosts": hosts,
            "writers": kinds,
            "sequence": pending.sequence,
            "filesystem": pending.mount.fstype if pending.mount else None,
            "shared_filesystem": bool(pending.mount and pending.mount.shared),
        },
    )


class SaveLedger:
    """This rank's side of the judgement: its writes into the job's store, and the one report."""

    def __init__(self, context: AuditContext) -> None:
        self.context = context
        self.announce = Announcer(context.report)
        self.audited = 0
        self._store: AuditStore | None = None
        self._host = socket.gethostname()

    def _job_store(self) -> AuditStore | None:
        if self._store is None:  # asked again at the next save until the job has one
            self._store = self.context.store("saves", STORE_TIMEOUT_S)
        return self._store

    def before(self, target: str, writer: str) -> PendingReport | None:
        store = self._job_store() if self.audited < MAX_AUDITED_SAVES else None
        if store is None:
            return None
        self.audited += 1
        import torch.distributed as dist

        real = os.path.realpath(os.path.abspath(target))
        mount = filesystem_of(os.path.dirname(real))
        scope = "shared" if mount is not None and mount.shared else f"host:{self._host}"
        sequence = self.context.sequence()
        key = store.prefix + hashlib.sha1(f"{scope}\0{real}\0{sequence}".encode()).hexdigest()[:24]
        user, library = _sites()
        me = Write(
            rank=dist.get_rank(),
            host=self._host,
            writer=writer,
            path=user[0] if user else None,
            line=user[1] if user else None,
            library=library[0] if library else None,
            library_site=library[1] if library else None,
        )
        try:
            store.client.append(key, me.encode() + _SEPARATOR)
            writes = self._read(store.client, key)
        except Exception:
            # the store is gone or slow (its host rank exited): no more store round trips from this rank's
            # saves
            self.audited = MAX_AUDITED_SAVES
            raise
        if not is_reporter(writes, me.rank):
            return None
        return PendingReport(key, real, mount, sequence, me)

    def after(self, pending: PendingReport) -> None:
        # read again after the write: writers that came in meanwhile are named too
        if self._store is not None:  # found by `before`, which made `pending`
            self.announce(race_finding(pending, self._read(self._store.client, pending.key)), pending.me.rank)

    @staticmethod
    def _read(client: StoreClient, key: str) -> list[Write]:
        raw = client.get(key).decode("utf-8", errors="replace")
        return [w for w in (Write.decode(line) for line in raw.split(_SEPARATOR) if line) if w is not None]


# the writers' own packages: the library named is the one that called the writer
_WRITER_PACKAGES = frozenset({"torch", "python", "safetensors", "fsspec"})


def _sites() -> tuple[tuple[str, int] | None, tuple[str, str] | None]:
    """(the user's file and line, (the library that called the writer, its file:line)) of this save."""
    frame: Any = sys._getframe(1)  # the audit's own frames are skipped as the guard's
    library: tuple[str, str] | None = None
    for _ in range(80):
        if frame is None:
            break
        filename = frame.f_code.co_filename
        if is_user(filename):
            return (filename, frame.f_lineno), library
        kind_library = classify(filename)[1]
        if library is None and kind_library is not None and kind_library not in _WRITER_PACKAGES:
            library = (kind_library, f"{os.path.basename(filename)}:{frame.f_lineno}")
        frame = frame.f_back
    return None, library


# Called after each checkpoint save to a path, with the user's line of the save (replicas.py compares the
# replicas after it).
SAVE_LISTENERS: list[Callable[[tuple[str, int] | None], None]] = []


def _saving(original: Callable[..., Any], ledger: SaveLedger, writer: str, position: int, name: str) -> Any:
    """`original` with the audit around it; the path is argument `position` (or keyword `name`)."""

    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        target = args[position] if len(args) > position else kwargs.get(name)
        if not isinstance(target, (str, os.PathLike)):  # a buffer or an open file: the common fast path
            return original(*args, **kwargs)
        pending = None
        with failsafe("checkpoints: before a save"):
            path = target_path(target)
            if path is not None:
                pending = ledger.before(path, writer)
        try:
            return original(*args, **kwargs)
        finally:
            if pending is not None:
                with failsafe("checkpoints: after a save"):
                    ledger.after(pending)
            if SAVE_LISTENERS:
                with failsafe("checkpoints: a save's listeners"):
                    site = _sites()[0]
                    for listener in SAVE_LISTENERS:
                        listener(site)

    return save


def install_checkpoint_audit(context: AuditContext) -> Uninstall:
    """Patch the writers this process has imported (see the module's doc)."""
    import torch
    import torch.serialization

    ledger = SaveLedger(context)
    removers: list[Uninstall] = []
    original = torch.serialization.save
    wrapped = _saving(original, ledger, "torch.save", 1, "f")
    removers.append(patch(torch.serialization, "save", lambda _: wrapped))
    if torch.save is original:
        removers.append(patch(torch, "save", lambda _: wrapped))
    safetensors_torch = sys.modules.get("safetensors.torch")
    if safetensors_torch is not None:
        removers.append(
            patch(safetensors_torch, "serialize_file",
                  lambda f: _saving(f, ledger, "safetensors save_file", 1, "filename"))
        )
    for package in ("lightning.fabric", "lightning_fabric"):
        torch_io = sys.modules.get(f"{package}.plugins.io.torch_io")
        if torch_io is not None and hasattr(torch_io, "TorchCheckpointIO"):
            removers.append(
                patch(torch_io.TorchCheckpointIO, "save_checkpoint",
                      lambda f: _saving(f, ledger, "Lightning TorchCheckpointIO", 2, "path"))
            )
    return all_of(removers)
