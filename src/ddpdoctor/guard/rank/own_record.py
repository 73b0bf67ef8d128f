"""What a rank says about itself: the meta file it leaves at start, and the record its monitor publishes."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...callsite import stack_of
from ...failsafe import failsafe
from ...records import ExitRecord, RankMeta, RankRecord, RankState
from ..judge.records import RECENT, exception_stack, short_error
from ..protocol import RunDir, atomic_write_json
from .lightning_metrics import metric_in_stack

if TYPE_CHECKING:
    from .runtime import GuardRuntime


def write_meta(runtime: GuardRuntime, host: str) -> None:
    """`rank-<r>.meta.json`: who this rank is, for the launcher and for peers that read its files."""
    rank, world_size, run_dir = runtime.identity()
    meta = RankMeta(rank, os.getpid(), host, world_size)
    atomic_write_json(RunDir(run_dir).meta(rank), meta.to_json())


def own_record(runtime: GuardRuntime, host: str, hb: int, state: RankState, *, with_stack: bool,
               error: str | None = None) -> RankRecord:
    """This rank's state. Small on ordinary heartbeats; `with_stack` (only while someone is suspicious)
    adds the recent calls, the main thread's stack and the Lightning metric being synced."""
    held = runtime.waiting()
    current = held[0] if held is not None else None
    record = RankRecord(
        rank=runtime.identity()[0], pid=os.getpid(), host=host, hb=hb, state=state,
        current=current.record() if current is not None else None,
        waited=round(time.monotonic() - held[1], 3) if held is not None else None,
        seqs=runtime.sequence_numbers(), flight=runtime.flight.path if runtime.flight else None, error=error,
        metric=current.metric if current is not None else None,
    )
    if not with_stack:
        return record
    return _with_history(runtime, record, current)


def _with_history(runtime: GuardRuntime, record: RankRecord, current: Any) -> RankRecord:
    recent = runtime.recent()[-RECENT:]
    python_seqs, complete = runtime.python_history()
    frame = sys._current_frames().get(runtime.main_thread_id or -1)
    metric = metric_in_stack(frame) if frame is not None else None
    return replace(
        record,
        recent=tuple(fp.record() for fp in recent if fp is not current),
        python_seqs={group: tuple(seqs) for group, seqs in python_seqs.items()}, history_complete=complete,
        groups=_group_members(runtime),
        stack=tuple(stack_of(frame)) if frame is not None else (),
        metric=metric or record.metric,
    )


def _group_members(runtime: GuardRuntime) -> dict[str, tuple[int, ...]]:
    """The members of each group but the default one, for peers to judge who takes part in a call."""
    import torch.distributed as dist

    out = {}
    for group, info in list(runtime.groups.items()):
        if group is runtime.default_group:
            continue
        with failsafe("own_record: a group's members"):
            out[info.name] = tuple(dist.get_process_group_ranks(group))
    return out


def write_exit_record(runtime: GuardRuntime, exc: BaseException | None) -> None:
    """`rank-<r>.exit.json`, for `records_from_run_dir`: the error, the stack where it was raised (innermost
    first) and every group's sequence number; or, with no exception, that the rank left on its own (at
    interpreter exit, which an error record already written must outlive)."""
    rank, _, run_dir = runtime.identity()
    path = RunDir(run_dir).exit_record(rank)
    if exc is None:
        if os.path.exists(path):
            return
        record = ExitRecord(exited=True, seqs=runtime.sequence_numbers())
    else:
        record = ExitRecord(
            error=short_error(exc),
            seqs=runtime.sequence_numbers(),
            stack=exception_stack(exc),
            gave_up=isinstance(exc, SystemExit),
        )
    atomic_write_json(path, record.to_json())
