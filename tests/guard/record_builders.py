"""Records for the judge's tests, made by the guard's own builders: a call is fingerprinted as the hot path
does it and turned into the `CallRecord` a rank publishes; a rank's record is the typed `RankRecord`."""

from __future__ import annotations

import time
from typing import Any

from ddpdoctor.guard.fingerprint import CollectiveFingerprint, CollectiveSignature
from ddpdoctor.records import CallRecord, Frame, RankRecord, RankState


def fp(op: str = "all_reduce", seq: int = 3, shapes: Any = ((4,),), dtype: str = "float32", line: int = 10,
       reduce_op: str | None = "SUM", root: int | None = None, state: str = "in",
       library: Frame | None = None) -> CallRecord:
    """A call as the hot path fingerprints it, as the rank's monitor publishes it."""
    signature = CollectiveSignature("0", op, reduce_op if op == "all_reduce" else None, root,
                                    [list(s) for s in shapes], [dtype] * len(shapes), ["cpu"],
                                    Frame("/job/train.py", line, "main", None), library)
    call = CollectiveFingerprint(seq, seq, time.time(), signature)
    call.state = state
    return call.record()


def rec(
    rank: int,
    current: CallRecord | None = None,
    waited: float | None = None,
    recent: list | None = None,
    seqs: dict | None = None,
    state: str = "running",
    stack: list | None = None,
    **learned: Any,
) -> RankRecord:
    return RankRecord(rank, pid=1, host="h", hb=1, state=RankState(state), current=current, waited=waited,
                      recent=tuple(recent or ()), seqs=seqs or {},
                      stack=tuple(Frame(*frame) for frame in stack or ()), **learned)
