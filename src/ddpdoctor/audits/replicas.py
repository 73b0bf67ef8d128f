"""F12 replica-divergence in a running job (replica_state.py judges; this module gathers and exchanges).

- At a wrap (`DistributedDataParallel`, FSDP, `fully_shard`), before the wrapper's first collective:
  this rank's layout goes into the job's store; every rank but 0 waits (at most `LAYOUT_WAIT_S`) for rank
  0's and names the first parameter that differs. DDP's own check would fail later with the index only
  (`params[2] in this process with sizes [..] appears not to match`) on one rank, and the peer would see a
  closed connection.
- For a DDP model, a digest of its parameters before forward passes 2, 4, 8, ... (doubling up to
  `DIGEST_EVERY`, then every `DIGEST_EVERY`: the same passes on every rank, whatever the clock says), and
  once more when the job destroys its process group. Each is published under its pass number; ranks
  compare with rank 0's as soon as it is there (without waiting, except at the end, `END_WAIT_S`).
  Also at the passes rank 0 names every few minutes and after each of its checkpoint saves
  (replica_points.py, whose thread also does the digests' store work off the training thread).
  Replicas that never synchronise (`no_sync()` around every micro-batch) are named by their first
  differing parameter; one finding per job.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..failsafe import failsafe
from ..findings import Finding
from .context import AuditContext, AuditStore, StoreClient
from .forward_counts import count_forwards, counter_of
from .patching import Uninstall, all_of, patch
from .replica_points import DigestPoints, interval_from_env
from .replica_state import (
    Digest,
    Layout,
    differing_parameters,
    digest_finding,
    layout_difference,
    layout_finding,
)

LAYOUT_WAIT_S = 30.0
END_WAIT_S = 5.0
DIGEST_EVERY = int(os.environ.get("DDPDOCTOR_DIGEST_EVERY", "1000") or 1000)


def layout_of(module: Any) -> Layout:
    named = list(module.named_parameters())
    return Layout(
        tuple(n for n, _ in named),
        tuple(tuple(p.shape) for _, p in named),
        tuple(str(p.dtype) for _, p in named),
    )


def digest_of(module: Any, forwards: int) -> Digest:
    """Sum and norm of every parameter: two fused passes (`_foreach_norm`, one `sum` each) and one copy
    to the host."""
    import torch

    named = [(n, p.detach()) for n, p in module.named_parameters()]
    if not named:
        return Digest(forwards, (), ())
    tensors = [p for _, p in named]
    with torch.no_grad():
        norms = torch._foreach_norm(tensors)
        sums = [t.sum() for t in tensors]  # in the parameter's dtype: no converted copy
        both = torch.stack([torch.stack([s.double(), n.double()]) for s, n in zip(sums, norms, strict=True)])
        values = both.flatten().cpu().tolist()
    return Digest(forwards, tuple(n for n, _ in named), tuple(values))


def _due(forwards: int) -> bool:
    """Before which passes a digest is taken: 2, 4, 8, ... then every DIGEST_EVERY (0: none; the points
    rank 0 names and the end remain)."""
    if forwards < 2 or DIGEST_EVERY <= 0:
        return False
    if forwards < DIGEST_EVERY:
        return forwards & (forwards - 1) == 0
    return forwards % DIGEST_EVERY == 0


_inside = threading.local()  # a wrap in progress on this thread: FSDP's auto-wrap nests its constructors


def before_wrap(original: Callable[..., Any], run: Callable[[tuple[Any, ...], dict[str, Any]], None]) -> Any:
    """`original` with `run(args, kwargs)` first, unless this thread is already inside such a wrap."""

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "active", False):
            return original(*args, **kwargs)
        with failsafe("replicas: the layout at a wrap"):
            run(args, kwargs)
        _inside.active = True
        try:
            return original(*args, **kwargs)
        finally:
            _inside.active = False

    return wrapped


def _user_site() -> tuple[str, int] | None:
    from ..callsite import is_user

    frame: Any = sys._getframe(1)
    while frame is not None:
        if is_user(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


class ReplicaWatch:
    """This rank's side: its layouts and digests in the store, compared with rank 0's."""

    def __init__(self, context: AuditContext) -> None:
        self.context = context
        self._job: AuditStore | None = None  # the job's store and this audit's keys, once the job has one
        self._prefix = ""
        self.rank = 0
        self.wraps = 0
        self.reported_drift = False
        self.models: list[tuple[weakref.ref[Any], str, tuple[str, int] | None]] = []
        self.pending: dict[str, tuple[Digest, str, tuple[str, int] | None]] = {}  # key -> what rank 0's meets
        self.points: list[DigestPoints] = []  # per model, the passes rank 0 names (replica_points.py)
        self._lock = threading.Lock()  # the store, from the training thread and the points' threads

    def _ready(self) -> bool:
        if self._job is not None:
            return True
        import torch.distributed as dist

        found = self.context.store("replicas")
        if found is None:
            return False
        self._job, self._prefix = found, found.prefix
        self.rank = dist.get_rank()
        return True

    @property
    def _store(self) -> StoreClient:
        """The job's store, asked only once `_ready()` said the job has one."""
        if self._job is None:
            raise RuntimeError("replicas: the job's store asked for before the job had one")
        return self._job.client

    # ---- at a wrap ------------------------------------------------------------------------------------
    def wrapping(self, module: Any, wrapper: str) -> None:
        """Before a wrapper's own code: compare this rank's layout with rank 0's."""
        import torch

        if not isinstance(module, torch.nn.Module) or not self._ready():
            return
        self.wraps += 1
        key = f"{self._prefix}layout/{self.wraps}/"
        mine = layout_of(module)
        self._store.set(key + str(self.rank), json.dumps(mine.to_json()))
        if self.rank == 0:
            return
        self._store.set_timeout(datetime.timedelta(seconds=LAYOUT_WAIT_S))
        try:
            theirs = Layout.from_json(json.loads(self._store.get(key + "0")))
        except Exception:  # noqa: BLE001 - rank 0 never wrapped this (or slowly): nothing to compare
            return
        found = layout_difference(mine, theirs)
        if found is not None:
            finding = layout_finding(
                self.rank, 0, wrapper, _user_site(), found[1], (len(mine.names), len(theirs.names))
            )
            self._say(finding)

    def wrapped_ddp(self, ddp: Any) -> None:
        """After DDP's constructor: count its passes and digest it on schedule."""
        if not self._ready():
            return
        counter = count_forwards(ddp, "DistributedDataParallel")
        site = _user_site()
        self.models.append((weakref.ref(ddp), "DistributedDataParallel", site))
        index = len(self.models) - 1

        points = DigestPoints(self._store, f"{self._prefix}points/{index}/", self.rank, self._lock,
                              lambda: counter.forwards, interval_from_env())
        self.points.append(points)
        points.start()

        def before_forward(module: Any, args: Any) -> None:
            forwards = counter.forwards  # the counter ran first (prepended): this pass is counted
            why = points.points.get(forwards)
            if why is not None or _due(forwards):
                when = f"before forward pass #{forwards}" + (f", {why}" if why else "")
                with failsafe("replicas: a digest"):
                    self.digest(index, module, when, str(forwards))

        ddp.register_forward_pre_hook(before_forward)

    def saved(self, site: tuple[str, int] | None) -> None:
        """After a checkpoint save on this rank: rank 0 names the next digest point."""
        where = f" at {os.path.basename(site[0])}:{site[1]}" if site else ""
        for points in self.points:
            points.request(f"the first comparison after the checkpoint save{where}")

    # ---- digests --------------------------------------------------------------------------------------
    def digest(self, index: int, module: Any, when: str, tag: str) -> None:
        if self.reported_drift:
            return
        counter = counter_of(module)
        digest = digest_of(
            module.module if hasattr(module, "module") else module, counter.forwards if counter else 0
        )
        key = f"{self._prefix}digest/{index}/{tag}/"
        _, wrapper, site = self.models[index]

        def publish() -> None:
            with self._lock:
                self._store.set(key + str(self.rank), json.dumps(digest.to_json()))
            if self.rank != 0:
                self.pending[key] = (digest, f"{when}, {wrapper}", site)
                self.compare(wait=False)

        if tag == "end" or index >= len(self.points):
            publish()
        else:  # the store's round trips on the points' thread
            self.points[index].submit(publish)

    def compare(self, wait: bool) -> None:
        """Compare the digests rank 0 has published by now (or within END_WAIT_S, at the end)."""
        if not self.pending or self.reported_drift:
            return
        keys = [key + "0" for key in self.pending]
        if wait:
            self._store.set_timeout(datetime.timedelta(seconds=END_WAIT_S))
            with failsafe("replicas: rank 0's last digest never came"):
                self._store.wait(keys)
        for key in list(self.pending):
            with self._lock:
                if not self._store.check([key + "0"]):
                    continue
                text = self._store.get(key + "0")
            mine, when_wrapper, site = self.pending.pop(key)
            theirs = Digest.from_json(json.loads(text))
            if mine.forwards != theirs.forwards:
                continue  # not the same pass: ranks ran different numbers of passes (another class)
            differing = differing_parameters(mine, theirs)
            if differing:
                when, wrapper = when_wrapper.rsplit(", ", 1)
                from ..advice import advice

                self._say(
                    digest_finding(
                        self.rank,
                        0,
                        wrapper,
                        site,
                        when,
                        differing,
                        len(mine.names),
                        advice("replica-divergence"),
                    )
                )
                self.reported_drift = True
                return

    def at_end(self) -> None:
        """When the process group is destroyed: one last digest of every live model, and the comparison."""
        if self._job is None:
            return
        for points in self.points:
            points.stop()  # and the store work it had not done yet, here
        for index, (ref, _, _) in enumerate(self.models):
            module = ref()
            if module is not None:
                counter = counter_of(module)
                forwards = counter.forwards if counter else 0
                self.digest(index, module, f"at the end of the job (after {forwards} forward passes)", "end")
        self.compare(wait=self.rank != 0)

    def _say(self, finding: Finding) -> None:
        self.context.report(finding)
        try:
            print(
                f"[ddpdoctor] {finding.severity.value} (rank {self.rank}): {finding.message}",
                file=sys.stderr,
                flush=True,
            )
        except (OSError, ValueError):
            pass


def install_replica_audit(context: AuditContext) -> Uninstall:
    """Patch the wrappers and destroy_process_group (see the module's doc)."""
    import torch.distributed as dist
    import torch.nn.parallel

    watch = ReplicaWatch(context)
    removers: list[Uninstall] = []
    ddp_class = torch.nn.parallel.DistributedDataParallel

    def ddp_init(original: Any) -> Any:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            module = args[0] if args else kwargs.get("module")
            with failsafe("replicas: the layout at DDP's wrap"):
                watch.wrapping(module, "DistributedDataParallel")
            original(self, *args, **kwargs)
            with failsafe("replicas: digests of a DDP model"):
                watch.wrapped_ddp(self)

        return init

    removers.append(patch(ddp_class, "__init__", ddp_init))
    fsdp = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp is not None:
        removers.append(
            patch(
                fsdp.FullyShardedDataParallel,
                "__init__",
                lambda f: before_wrap(
                    f,
                    lambda args, kwargs: watch.wrapping(
                        args[1] if len(args) > 1 else kwargs.get("module"), "FullyShardedDataParallel"
                    ),
                ),
            )
        )
    fully_shard_module = sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard")
    if fully_shard_module is not None:

        def fsdp2(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if len(args) > 1 and args[1] == "fully_shard":
                for module in args[0] if isinstance(args[0], (list, tuple)) else [args[0]]:
                    watch.wrapping(module, "fully_shard")

        removers.append(patch(fully_shard_module, "_validate_module", lambda f: before_wrap(f, fsdp2)))

    def destroy(original: Any) -> Any:
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not args and kwargs.get("group") is None:  # the default group: the job's end
                with failsafe("replicas: the digest at the end"):
                    watch.at_end()
            return original(*args, **kwargs)

        destroy_process_group.__wrapped__ = original  # type: ignore[attr-defined]
        return destroy_process_group

    removers.append(patch(dist, "destroy_process_group", destroy))
    from . import checkpoints

    checkpoints.SAVE_LISTENERS.append(watch.saved)
    removers.append(lambda: checkpoints.SAVE_LISTENERS.remove(watch.saved))
    return all_of(removers)
