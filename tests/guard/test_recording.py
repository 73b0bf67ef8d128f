"""The flight file (survives a SIGABRT) and the checkpoint chain (catches mismatches the backend
completes)."""

from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as dist

from ddpdoctor.guard.config import GuardConfig
from ddpdoctor.guard.fingerprint import CollectiveFingerprint, CollectiveSignature
from ddpdoctor.guard.judge.checkpoints import first_difference
from ddpdoctor.guard.judge.flight_files import read_flight
from ddpdoctor.guard.protocol import StoreKeys
from ddpdoctor.guard.rank.call_ring import MASK, SLOTS, CallRing
from ddpdoctor.guard.rank.consensus import SEGMENT, ChainCheck
from ddpdoctor.guard.rank.flight import FlightFile
from ddpdoctor.guard.rank.runtime import GuardRuntime
from ddpdoctor.records import Frame, MetricOrigin


def make(index: int, reduce_op: str = "SUM", shape: int = 4) -> CollectiveFingerprint:
    site = Frame('/job/it\'s "quoted".py', 3, "main", None)
    signature = CollectiveSignature(
        "0", "all_reduce", reduce_op, None, [[shape]], ["float32"], ["cpu"], site, None
    )
    return CollectiveFingerprint(index, index - 1, time.time(), signature)


def write(ring: CallRing, fp: CollectiveFingerprint) -> None:
    """What the hot path does (calls.py): the call's slot, then the ring's count."""
    ring.slots[fp.index & MASK] = fp
    ring.count = fp.index


def test_flight_file_keeps_the_last_slots_and_their_state(tmp_path: Path) -> None:
    flight = FlightFile(str(tmp_path / "rank-0.flight"), slots=4)
    fps = [make(i) for i in range(1, 7)]
    for fp in fps[:-1]:
        flight.enter(fp)
        flight.finish(fp, True)
    flight.enter(fps[-1])  # still inside when the process died
    flight.close()
    read = read_flight(str(tmp_path / "rank-0.flight"))
    assert [r.index for r in read] == [3, 4, 5, 6]
    assert [r.state.value for r in read] == ["done", "done", "done", "in"]
    assert read[-1].site == Frame('/job/it\'s "quoted".py', 3, "main", None)
    assert read[-1].shapes == ((4,),) and read[-1].reduce_op == "SUM"


def test_a_short_record_over_a_longer_one_and_a_huge_one_read_back_whole(tmp_path: Path) -> None:
    flight = FlightFile(str(tmp_path / "rank-0.flight"), slots=1)
    long_path = Frame("/very/" + "deep/" * 300 + "train.py", 7, "step", None)
    huge = CollectiveSignature("0", "all_gather", None, None, [[i, 2] for i in range(400)], ["float32"] * 400,
                               ["cpu"] * 400, long_path, None)
    flight.enter(CollectiveFingerprint(1, 0, time.time(), huge))
    assert read_flight(str(tmp_path / "rank-0.flight"))[0].site == Frame("train.py", 7, "step", None)
    flight.enter(make(2))  # same slot, much shorter record
    flight.close()
    (read,) = read_flight(str(tmp_path / "rank-0.flight"))
    assert (read.index, read.op, read.shapes, read.state.value) == (2, "all_reduce", ((4,),), "in")


def test_chain_checkpoints_catch_a_completed_reduce_op_mismatch() -> None:
    store = dist.HashStore()
    ours, theirs = ChainCheck(0), ChainCheck(1)
    fps0 = [make(i) for i in range(1, SEGMENT + 1)]
    fps1 = [make(i, reduce_op="MAX" if i == 5 else "SUM") for i in range(1, SEGMENT + 1)]
    for fp in fps0:
        ours.update(fp)
    for fp in fps1:
        theirs.update(fp)
    assert ours.publish(store, StoreKeys()) is None  # first at the checkpoint: writes it
    mismatch = theirs.publish(store, StoreKeys())
    assert mismatch is not None
    pair = first_difference(*mismatch)
    assert pair is not None and {pair[0].reduce_op, pair[1].reduce_op} == {"SUM", "MAX"}
    assert pair[0].seq == 4


def test_chain_checkpoints_agree_on_identical_histories() -> None:
    store = dist.HashStore()
    checks = [ChainCheck(r) for r in range(3)]
    for check in checks:
        for i in range(1, 2 * SEGMENT + 3):
            check.update(make(i))
        check.flush()
        assert check.publish(store, StoreKeys()) is None


def test_a_slot_that_holds_the_signature_already_gets_the_new_numbers(tmp_path: Path) -> None:
    """A loop re-enters the same signature: only the header is rewritten, and it must read back as the newest
    call, not as the one that first wrote the slot's signature."""
    flight = FlightFile(str(tmp_path / "rank-0.flight"), slots=2)
    first = make(1)
    flight.enter(first)
    flight.finish(first, True)
    again = CollectiveFingerprint(3, 41, first.time + 2.5, first.signature)  # slot 1 again, same signature
    flight.enter(again)
    flight.close()
    (read,) = read_flight(str(tmp_path / "rank-0.flight"))
    assert (read.index, read.seq, read.state.value, read.op) == (3, 41, "in", "all_reduce")
    assert abs(read.time - (first.time + 2.5)) < 1e-6


def test_the_chain_folds_only_calls_that_returned_and_skips_failed_and_point_to_point_ones() -> None:
    check = ChainCheck(0)
    fps = [make(i) for i in range(1, SEGMENT + 4)]
    fps[2].state = "failed"
    p2p = CollectiveFingerprint(
        99,
        -1,
        time.time(),
        CollectiveSignature("0", "send", None, 1, [[4]], ["float32"], ["cpu"], None, None),
    )
    ring = CallRing(256)
    for index, fp in enumerate(fps[:5] + [p2p] + fps[5:], start=1):
        fp.index = index
        write(ring, fp)
    still_inside = fps[-1]
    check.fold(ring, still_inside)
    assert check.folded == still_inside.index - 1  # waits for the call to return
    assert check.chains["0"].count == len(fps) - 2  # minus the failed one and the one still running
    assert [fp.index for fp in check.pending[0][3]] == [1, 2, 4, 5, 7, 8, 9, 10]
    check.fold(ring, None)
    assert check.folded == ring.count and check.chains["0"].count == len(fps) - 1


def test_the_call_ring_keeps_the_last_calls_of_the_group_and_lets_folded_older_ones_go() -> None:
    ring = CallRing(keep=4)
    fps = [make(i) for i in range(1, 11)]
    for fp in fps[:3]:
        write(ring, fp)
    assert ring.recent() == fps[:3] and ring.complete()
    for fp in fps[3:]:
        write(ring, fp)
    assert ring.recent() == fps[-4:] and not ring.complete()
    check = ChainCheck(0)
    check.fold(ring, None)
    assert check.chains["0"].count == 10
    assert sum(slot is not None for slot in ring.slots) == 4  # folded and out of the history: let go
    ring.clear()  # a new default group: its history starts empty, its calls are numbered on
    write(ring, make(11))
    assert [fp.index for fp in ring.recent()] == [11] and ring.complete()


class OneByOne(ChainCheck):
    """The fold without its batches: every call through the per-call loop."""

    def _fold_batch(self, ring: CallRing, batch: list, index: int, newest: int) -> bool:
        return False


class Batched(ChainCheck):
    """The fold, counting the batches it folded in one go."""

    batches = 0

    def _fold_batch(self, ring: CallRing, batch: list, index: int, newest: int) -> bool:
        done = super()._fold_batch(ring, batch, index, newest)
        self.batches += done
        return done


def test_the_batched_fold_gives_the_checkpoints_and_history_the_per_call_fold_gives() -> None:
    """Batches of one group's calls are folded by C loops; a batch with a failed call, a point-to-point op,
    another group or a Lightning metric in it goes call by call. Either way: the same chains, the same
    checkpoints (digests and calls), the same calls kept in the ring."""
    def history(ring: CallRing) -> list[CollectiveFingerprint]:
        fps = []
        for index in range(1, 1500):
            fp = make(index, shape=1 + index % 3)
            if index in (300, 1400):
                fp.state = "failed"
            if 600 <= index < 700 and index % 5 == 0:
                fp.signature = CollectiveSignature("1", "all_reduce", "SUM", None, [[2]], ["float32"],
                                                   ["cpu"], None, None)
            if index == 800:
                fp.metric = MetricOrigin("loss", "train.py", 7, "training_step")
            fps.append(fp)
            write(ring, fp)
        return fps

    folded = []
    batched = Batched(0)
    for check, ring in ((batched, CallRing(keep=40)), (OneByOne(0), CallRing(keep=40))):
        fps = history(ring)
        check.fold(ring, fps[1000])  # stops at the call still in progress
        assert check.folded == 1000
        pending = [(group, count, digest, [fp.index for fp in calls]) for group, count, digest, calls in
                   check.pending]
        check.fold(ring, None)
        check.flush()
        kept = [slot.index for slot in ring.slots if slot is not None]
        chains = {group: (chain.count, chain.digest, [fp.index for fp in chain.segment])
                  for group, chain in check.chains.items()}
        last = [(group, count, digest, [fp.index for fp in calls]) for group, count, digest, calls in
                check.pending]
        folded.append((pending, chains, last, kept))
    assert folded[0] == folded[1]
    assert batched.batches == 2  # 1-256 and 1001-1256; the others hold a failed call, group 1's, a metric
    assert folded[0][3] == list(range(1460, 1500))  # the history's last calls, the rest let go


def test_a_chain_whose_queue_overflowed_is_not_compared() -> None:
    """More calls than the ring holds between two folds: some were overwritten, so a comparison could only
    raise a false alarm. The rank stops publishing its checkpoints instead."""
    store = dist.HashStore()
    full, other = ChainCheck(0), ChainCheck(1)
    ring = CallRing(256)
    for i in range(1, SLOTS + 9):
        write(ring, make(i))
    full.fold(ring, None)
    for i in range(1, SEGMENT + 1):
        other.update(make(i, reduce_op="MAX"))
    assert other.publish(store, StoreKeys()) is None
    assert full.broken and full.publish(store, StoreKeys()) is None


def test_a_pending_receive_does_not_hide_the_collective_waited_for_behind_it() -> None:
    """An irecv is not judged (it pairs with one peer); an async all_reduce issued after it, still not
    complete, is what the rank is held up by."""
    runtime = GuardRuntime(GuardConfig())
    site = Frame("/job/train.py", 3, "main", None)
    receive = CollectiveFingerprint(
        1, -1, 0.0, CollectiveSignature("0", "irecv", None, 1, [[4]], ["float32"], ["cpu"], site, None)
    )
    reduce = make(2)
    runtime.pending.append((receive, lambda: False, 10.0, None))
    runtime.pending.append((reduce, lambda: False, 11.0, None))
    assert runtime.waiting() == (reduce, 11.0)



class _Marker:
    """Stands in for a CUDA event (this machine has no GPU): completed once the stream got past it."""

    def __init__(self, stream: tuple, position: int, reached: list[int], queries: list[int]) -> None:
        self.stream, self.position, self.reached, self.queries = stream, position, reached, queries

    def done(self) -> bool:
        self.queries.append(self.position)
        return self.reached[0] >= self.position


def test_gpu_collectives_are_asked_about_in_batches_not_once_per_collective() -> None:
    """A CUDA event query takes the context's lock the training thread launches kernels under: the training
    thread asks once per QUERY_EVERY collectives, the monitor at its heartbeat with one query for a whole
    stream's worth (the newest marker completed means every one before it on that stream did)."""
    from ddpdoctor.guard.rank.pending import QUERY_EVERY

    runtime = GuardRuntime(GuardConfig())
    reached, queries = [0], []
    fps = []
    for i in range(1, 101):
        signature = CollectiveSignature("0", "all_reduce", "SUM", None, [[4]], ["float32"], ["cuda:0"],
                                        Frame("/job/train.py", 3, "main", None), None)
        fp = CollectiveFingerprint(i, i, 0.0, signature)
        fps.append(fp)
        marker = _Marker((1, 0, 1), i, reached, queries)
        runtime.pending.append((fp, marker.done, float(i), marker))
        runtime.async_work.drain()  # what `after` does at each call
    assert len(queries) <= 2 * (100 // QUERY_EVERY)  # the newest and the oldest, per batch: not one per call
    queries.clear()
    reached[0] = 100  # the GPU got past all of them
    assert runtime.waiting() is None
    assert len(queries) == 1 and all(fp.state == "done" for fp in fps)
    runtime.async_work.drain()
    assert not runtime.pending and len(queries) == 1  # dropped from the queue without asking again


def test_a_gpu_collective_still_queued_is_what_the_rank_waits_in() -> None:
    runtime = GuardRuntime(GuardConfig())
    reached, queries = [3], []
    for i in range(1, 6):
        signature = CollectiveSignature("0", "all_reduce", "SUM", None, [[4]], ["float32"], ["cuda:0"],
                                        Frame("/job/train.py", 3, "main", None), None)
        marker = _Marker((1, 0, 1), i, reached, queries)
        runtime.pending.append((CollectiveFingerprint(i, i, 0.0, signature), marker.done, float(i), marker))
    held = runtime.waiting()
    assert held is not None and held[0].index == 4 and held[1] == 4.0


def test_reduce_op_objects_are_named_alike_on_every_rank() -> None:
    """torch's ReduceOp objects print their address; two ranks' objects for one reduction must agree."""
    from ddpdoctor.guard.rank.groups import reduce_op_name

    assert reduce_op_name(dist._make_nccl_premul_sum(0.5)) == "PREMUL_SUM"
    assert (
        reduce_op_name(dist.ReduceOp(dist.ReduceOp.AVG))
        == reduce_op_name(dist.ReduceOp(dist.ReduceOp.AVG))
        == "AVG"
    )


def test_a_calls_shapes_say_which_tensors_it_reads_and_which_it_fills() -> None:
    """`all_gather [1] [1] float32` did not say the two shapes were the output list; an in-place call's one
    tensor (all_reduce) is both, and stays unlabelled."""
    import torch

    from ddpdoctor.guard.fingerprint import describe
    from ddpdoctor.guard.rank.intercept import OpSpec
    from ddpdoctor.guard.rank.signatures import roles as _roles

    piece, out = torch.zeros(1), [torch.zeros(1), torch.zeros(1)]
    gather = OpSpec("all_gather", dist.all_gather)
    into = OpSpec("all_gather_into_tensor", dist.all_gather_into_tensor)
    reduce = OpSpec("all_reduce", dist.all_reduce)
    assert _roles(gather, (out, piece), {}) == ("out", "out")  # its own piece is rank-local: not compared
    assert _roles(into, (torch.zeros(2),), {"input_tensor": piece}) == ("out", "in")
    assert _roles(reduce, (piece,), {}) == ("",)

    def call(op: str, shapes: list, roles: tuple[str, ...]) -> str:
        signature = CollectiveSignature(
            "0", op, None, None, shapes, ["float32"] * len(shapes), ["cpu"] * len(shapes), None, None, roles
        )
        return describe(CollectiveFingerprint(1, 0, 0.0, signature).record())

    assert call("all_gather", [[1], [1]], ("out", "out")) == "all_gather out [1] [1] float32"
    assert (
        call("all_gather_into_tensor", [[2], [1]], ("out", "in"))
        == "all_gather_into_tensor out [2] in [1] float32"
    )
    assert call("all_reduce", [[3]], ("",)) == "all_reduce [3] float32"


def test_a_completed_mismatch_between_two_chains_is_decided_with_both_calls() -> None:
    """gloo completes an all_reduce whose ranks passed SUM and MAX: the chain checkpoints name the call."""
    from ddpdoctor.guard.judge.verdict import Decision, chain_mismatch

    store = dist.HashStore()
    ours, theirs = ChainCheck(0), ChainCheck(1)
    for i in range(1, SEGMENT + 1):
        ours.update(make(i))
        theirs.update(make(i, reduce_op="MAX" if i == 5 else "SUM"))
    assert ours.publish(store, StoreKeys()) is None
    mismatch = theirs.publish(store, StoreKeys())
    assert mismatch is not None
    verdict = chain_mismatch(1, *mismatch)
    assert verdict is not None and verdict.decision is Decision.COMPLETED_MISMATCH
    assert (verdict.seq, verdict.mismatch, sorted(verdict.rows)) == (4, ("reduce_op",), [0, 1])
    assert verdict.headline.startswith("ReduceOp mismatch: rank 0 all_reduce(SUM) [4] float32 vs rank 1 "
                                       "all_reduce(MAX) [4] float32")
