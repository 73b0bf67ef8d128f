"""The decision rules, on records made by the guard's own builders (the hot path's fingerprints, turned into
the `CallRecord`s a rank publishes) and typed `RankRecord`s."""

from __future__ import annotations

from dataclasses import replace

from record_builders import fp, rec

from ddpdoctor.guard.judge.verdict import Decision, decide, died_first
from ddpdoctor.records import CallRecord, CallState, Frame, RankRecord, RankStatus


def test_same_position_different_shape_is_divergence() -> None:
    records = {0: rec(0, fp(shapes=[(3,)]), 1.5), 1: rec(1, fp(shapes=[(5,)]), 0.2)}
    verdict = decide(records, 2, dead=set(), grace=1.0, hang_after=300)
    assert verdict is not None and verdict.class_ == "collective-divergence"
    assert verdict.headline.startswith(
        "shape mismatch: rank 0 all_reduce(SUM) [3] float32 vs rank 1 all_reduce(SUM) [5] float32 at "
        "/job/train.py:10 in main"
    )
    assert [loc.line for loc in verdict.finding().locations] == [10, 10]


def test_nothing_is_decided_within_the_grace_period() -> None:
    records = {0: rec(0, fp(shapes=[(3,)]), 0.5), 1: rec(1, fp(shapes=[(5,)]), 0.5)}
    assert decide(records, 2, dead=set(), grace=1.0, hang_after=300) is None


def test_a_mismatch_one_rank_returned_from_says_that_rank_went_on_with_wrong_data() -> None:
    """An all_gather of uneven sizes: gloo aborts the rank that receives more than it expects, and the one
    that receives less returns from the call with what arrived, prints its result and exits 0."""
    gathered = fp(op="all_gather", shapes=[(10,), (10,)], state="done")
    records = {0: rec(0, None, state="exited", recent=[gathered]),
               1: rec(1, fp(op="all_gather", shapes=[(7,), (7,)]), 0.0, state="dead")}
    verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=float("inf"))
    assert verdict is not None and verdict.headline.startswith(
        "shape mismatch: rank 0 all_gather [10] [10] float32 vs rank 1 all_gather [7] [7] float32"
    )
    assert verdict.headline.endswith(
        "(collective #3 of group 0; rank 0 returned from it anyway, with wrong data)"
    )


def test_peer_that_completed_the_position_with_another_op() -> None:
    records = {
        0: rec(0, fp(), 2.0),
        1: rec(1, None, recent=[fp(op="broadcast", root=0, state="done")], seqs={"0": 4}),
    }
    verdict = decide(records, 2, dead=set(), grace=1.0, hang_after=300)
    assert verdict is not None and verdict.headline.startswith(
        "op mismatch: rank 0 all_reduce(SUM) [4] float32 vs rank 1 broadcast(root=0)"
    )


def test_peer_past_the_position_through_cpp_collectives() -> None:
    # rank 1 never issued #3 from Python but its group counter is at 5: DDP's buckets (C++) went by
    records = {0: rec(0, fp(seq=3), 2.0, seqs={"0": 3}),
               1: rec(1, None, recent=[fp(seq=2, state="done")], seqs={"0": 5})}
    verdict = decide(records, 2, dead=set(), grace=1.0, hang_after=300)
    assert verdict is not None and verdict.decision is Decision.PASSED_OUTSIDE_PYTHON
    assert "already passed #3 with a collective issued outside Python" in verdict.headline


def test_a_peer_whose_last_collective_came_from_cpp_in_backward_is_named_in_it_not_past_it() -> None:
    """Uneven batches under DDP: rank 0 runs one more backward, whose gradient all_reduce (from C++) is #3,
    while rank 1 waits in a barrier at #3. Rank 0 is in backward, likely waiting in #3: not "past" it."""
    backward = [["/venv/site-packages/torch/autograd/graph.py", 979, "_engine_run_backward", "torch"],
                ["/venv/site-packages/torch/autograd/__init__.py", 395, "backward", "torch"],
                ["/venv/site-packages/torch/_tensor.py", 623, "backward", "torch"],
                ["/job/train.py", 18, "main", None]]
    records = {0: rec(0, None, recent=[fp(seq=2, state="done")], seqs={"0": 4}, stack=backward),
               1: rec(1, fp(op="barrier", seq=3, shapes=()), 2.0, seqs={"0": 4})}
    verdict = decide(records, 2, dead=set(), grace=1.0, hang_after=300)
    assert verdict is not None and verdict.decision is Decision.PASSED_OUTSIDE_PYTHON
    assert verdict.headline.endswith(
        "but rank 0's #3 is a collective issued outside Python (from C++, e.g. DDP's "
        "gradient all_reduce) (now in backward at /job/train.py:18 in main)"
    ), verdict.headline
    assert verdict.rows[0].state == "in backward, not in a Python collective (at /job/train.py:18 in main)"
    assert verdict.rows[0].status is RankStatus.IN_BACKWARD
    fix = verdict.finding().fix
    assert fix is not None and "torch.distributed.algorithms.Join([model])" in fix.message
    assert "rank_zero_only" not in fix.message  # the Lightning logging advice is for another cause


def test_a_peers_python_history_per_group_says_whether_it_made_the_call() -> None:
    """Beyond its last records: #3 among the Python-issued numbers it still holds (it made the call),
    absent from a history that reaches back past #3 (a C++ collective), or a history that starts after
    #3 (cannot tell: no verdict yet)."""
    def peer(python_seqs: list[int], complete: bool) -> RankRecord:
        return rec(
            1,
            None,
            recent=[],
            seqs={"0": 5},
            python_seqs={"0": tuple(python_seqs), "solo": (0, 1, 2)},
            history_complete=complete,
        )

    waiter = rec(0, fp(seq=3), 2.0, seqs={"0": 3})
    made_it = decide({0: waiter, 1: peer([1, 2, 3], False)}, 2, dead=set(), grace=1.0, hang_after=300)
    cpp = decide({0: waiter, 1: peer([1, 2], False)}, 2, dead=set(), grace=1.0, hang_after=300)
    cpp_only = decide({0: waiter, 1: peer([], True)}, 2, dead=set(), grace=1.0, hang_after=300)
    unknown = decide({0: waiter, 1: peer([4], False)}, 2, dead=set(), grace=1.0, hang_after=300)
    assert made_it is None and unknown is None
    assert cpp is not None and cpp.decision is Decision.PASSED_OUTSIDE_PYTHON
    assert cpp_only is not None and cpp_only.decision is Decision.PASSED_OUTSIDE_PYTHON


def test_peer_that_died_after_passing_the_position_outside_python_is_divergence_not_dead_rank() -> None:
    # gloo aborts on the size mismatch, so both die; the peer's exit record says how far it got, and where
    records = {0: rec(0, fp(seq=8), 0.0, state="dead"),
               1: rec(1, None, state="dead", seqs={"0": 9}, stack=[["/job/train.py", 27, "<module>", None]],
                      error="RuntimeError: Connection reset by peer")}
    verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=float("inf"))  # as the launcher decides
    assert verdict is not None and verdict.class_ == "collective-divergence"
    assert verdict.headline.startswith("rank 0 was in all_reduce(SUM) [4] float32")
    # its last collective, #8, is the one issued from C++: it may have died in it, not after it
    assert verdict.headline.endswith(
        "but rank 1's #8 is a collective issued outside Python (from C++, e.g. DDP's "
        "gradient all_reduce) (died at /job/train.py:27 in <module>)"
    ), verdict.headline
    assert verdict.rows[1].state == "dead: RuntimeError: Connection reset by peer"


def test_peer_elsewhere_waits_for_hang_after_then_reports_its_stack() -> None:
    stack = [["/job/train.py", 42, "evaluate", None]]
    records = {0: rec(0, fp(), 5.0, seqs={"0": 3}), 1: rec(1, None, seqs={"0": 3}, stack=stack)}
    assert decide(records, 2, dead=set(), grace=1.0, hang_after=30) is None
    records[0] = replace(records[0], waited=31.0)
    verdict = decide(records, 2, dead=set(), grace=1.0, hang_after=30)
    assert verdict is not None and verdict.class_ == "collective-timeout"
    assert "rank 1 is running, not in a collective (at /job/train.py:42 in evaluate)" in verdict.headline


def test_dead_peer_is_dead_rank_and_its_place_is_the_findings_place() -> None:
    records = {0: rec(0, fp(line=10), 2.0), 1: rec(1, None, recent=[fp(seq=2, state="done", line=7)])}
    verdict = decide(records, 2, dead={1}, grace=1.0, hang_after=300)
    assert verdict is not None and verdict.class_ == "dead-rank"
    assert verdict.headline.startswith("rank 1 died")
    finding = verdict.finding()
    assert (finding.location.rank, finding.location.line) == (1, 7)
    assert finding.facts["ranks"]["1"]["fingerprint"]["seq"] == 2


def test_rank_that_died_first_is_the_cause_when_the_launcher_stopped_the_others() -> None:
    # as `ddpdoctor run` concludes after torchrun stopped rank 0: rank 1 was seen gone first
    records = {0: rec(0, None, state="stopped", recent=[fp(seq=4, state="done", line=16)]),
               1: rec(1, None, state="dead", recent=[fp(seq=4, state="done", line=16)])}
    assert decide(records, 2, dead={1}, grace=0.0, hang_after=float("inf")) is None  # nobody waited on rank 1
    verdict = died_first(records, 2, {1})
    assert verdict.class_ == "dead-rank"
    assert verdict.headline == (
        "rank 1 died (process gone, no Python error: a signal such as SIGKILL) after all_reduce(SUM) [4] "
        "float32 at /job/train.py:16 in main; the launcher then stopped rank 0"
    )
    assert verdict.rows[0].state.startswith(
        "stopped by the launcher outside a collective; its last collective"
    )
    assert verdict.finding().location.rank == 1


def test_a_rank_the_dead_one_failed_and_the_launcher_then_stopped_says_both() -> None:
    """4 ranks, rank 1 SIGKILLed: rank 0's all_reduce failed on the reset connection, then torchrun stopped it
    before it exited of the error. It is a victim: not "dead (killed by SIGTERM ...)"."""
    failed = fp(seq=5, state="failed")
    records = {0: rec(0, failed, 0.0, state="stopped", error="RuntimeError: Connection reset by peer"),
               1: rec(1, None, state="dead", recent=[fp(seq=4, state="done")], exit_status=9),
               2: rec(2, fp(seq=5), 0.0, state="stopped")}
    verdict = decide(records, 3, dead=set(), grace=0.0, hang_after=float("inf"))
    assert verdict is not None and verdict.class_ == "dead-rank"
    assert verdict.headline.startswith("rank 1 died (killed by SIGKILL"), verdict.headline
    assert verdict.rows[0].state == (
        "failed in all_reduce(SUM) [4] float32 (collective #5 of group 0): "
        "RuntimeError: Connection reset by peer; then stopped by the launcher"
    )
    assert (
        verdict.rows[2].state
        == "in all_reduce(SUM) [4] float32 (collective #5 of group 0); then stopped by the launcher"
    )
    # a live rank that had just entered the broken call when the verdict came: no "waiting 0.0 s"
    records[2] = rec(2, fp(seq=5), 0.01)
    rows = decide(records, 3, dead=set(), grace=0.0, hang_after=float("inf")).rows  # type: ignore[union-attr]
    assert rows[2].state == "in all_reduce(SUM) [4] float32 (collective #5 of group 0)"


def test_a_rank_judged_before_it_published_its_stack_shows_the_frames_its_call_recorded() -> None:
    """An op mismatch is decided as soon as both ranks are in their calls, often before a rank's monitor has
    published its stack: the stack column still shows the library's frame and the user's line below it."""
    library = Frame("/venv/site-packages/accelerate/state.py", 412, "wait_for_everyone", "accelerate")
    barrier = fp(op="barrier", shapes=(), library=library)
    records = {0: rec(0, barrier, 1.5), 1: rec(1, fp(), 1.5, stack=[["/job/train.py", 10, "main", None]])}
    verdict = decide(records, 2, dead=set(), grace=1.0, hang_after=300)
    assert verdict is not None and verdict.headline.startswith("op mismatch")
    assert verdict.rows[0].stack == (library, Frame("/job/train.py", 10, "main", None))
    assert verdict.rows[1].stack == (Frame("/job/train.py", 10, "main", None),)  # its own, as published


def test_every_rank_row_carries_the_fingerprint_it_is_in_or_last_completed() -> None:
    records = {0: rec(0, fp(seq=5), 2.0, seqs={"0": 5}),
               1: rec(1, None, state="exited", recent=[fp(seq=4, state="done")], seqs={"0": 5}),
               2: rec(2, None, state="stopped", recent=[fp(seq=3, state="done")], seqs={"0": 4}),
               3: rec(3, None, recent=[fp(seq=4, state="done")], seqs={"0": 5})}
    verdict = decide(records, 4, dead=set(), grace=1.0, hang_after=0)
    assert verdict is not None
    ranks = verdict.finding().facts["ranks"]
    assert [ranks[str(r)]["fingerprint"]["seq"] for r in range(4)] == [5, 4, 3, 4]


def test_only_ranks_the_launcher_stopped_are_said_to_be_stopped() -> None:
    records = {0: rec(0, None, state="dead", recent=[fp(seq=4, state="done")], exit_status=6),  # SIGABRT
               1: rec(1, None, state="exited", recent=[fp(seq=4, state="done")]),
               2: rec(2, None, state="stopped", recent=[fp(seq=4, state="done")])}
    verdict = died_first(records, 3, {0})
    assert verdict.headline.startswith("rank 0 died (killed by SIGABRT: a native abort")
    assert verdict.headline.endswith("; the launcher then stopped rank 2")
    assert verdict.rows[1].state.startswith("exited") and verdict.rows[1].status is RankStatus.EXITED


def test_the_dead_ranks_signal_is_named_when_its_exit_status_was_seen() -> None:
    records = {
        0: rec(0, fp(), 2.0),
        1: rec(1, None, recent=[fp(seq=2, state="done")], exit_status=9),
    }  # SIGKILL
    verdict = decide(records, 2, dead={1}, grace=1.0, hang_after=300)
    assert verdict is not None and verdict.headline.startswith(
        "rank 1 died (killed by SIGKILL: what the kernel's OOM killer sends, and schedulers enforcing a "
        "memory or time limit) while rank 0 waits in all_reduce(SUM) [4] float32"
    )
    assert (
        verdict.rows[1].state
        == "dead (killed by SIGKILL; after all_reduce(SUM) [4] float32, #2 of group 0, "
        "at /job/train.py:10 in main)"
    )
    fix = verdict.finding().fix
    assert fix is not None and "`dmesg`" in fix.message and "Out of memory: Killed process" in fix.message
    records[1] = replace(records[1], exit_status=7)  # SIGBUS
    fix = decide(records, 2, dead={1}, grace=1.0, hang_after=300).finding().fix  # type: ignore[union-attr]
    assert fix is not None and "/dev/shm" in fix.message
    records[1] = replace(records[1], exit_status=3 << 8)  # exited with code 3
    verdict = decide(records, 2, dead={1}, grace=1.0, hang_after=300)
    assert verdict is not None and verdict.headline.startswith("rank 1 died (exit code 3) while")
    assert verdict.finding().fix.message.startswith("find why that rank died first")  # type: ignore[union-attr]


def test_rank_the_launcher_stopped_in_a_collective_waited_on_the_dead_one() -> None:
    # SIGTERMed while blocked in the all_reduce, before gloo noticed the peer was gone
    records = {0: rec(0, fp(seq=5), 0.0, state="stopped"),
               1: rec(1, None, state="dead", recent=[fp(seq=4, state="done")])}
    verdict = decide(records, 2, dead=set(), grace=0.0, hang_after=float("inf"))  # as the launcher decides
    assert verdict is not None and verdict.class_ == "dead-rank"
    assert verdict.headline.startswith(
        "rank 1 died (no heartbeat / process gone) while rank 0 waits in all_reduce"
    )
    assert (
        verdict.rows[0].state
        == "in all_reduce(SUM) [4] float32 (collective #5 of group 0); then stopped by the launcher"
    )
    assert (
        verdict.rows[1].state
        == "dead (after all_reduce(SUM) [4] float32, #4 of group 0, at /job/train.py:10 in main)"
    )


def test_exited_peer_is_divergence() -> None:
    records = {
        0: rec(0, fp(), 2.0),
        1: rec(1, None, state="exited", recent=[fp(seq=2, state="done", line=7)]),
    }
    verdict = decide(records, 2, dead=set(), grace=1.0, hang_after=300)
    assert verdict is not None and verdict.class_ == "collective-divergence"
    assert "rank 1 finished without calling it" in verdict.headline
    assert verdict.rows[1].location == ("/job/train.py", 7)


def test_peer_that_made_the_call_and_then_exited_is_not_blamed() -> None:
    """gather(dst=1) on 3 ranks: rank 0 sent its part and finished; the root waits for a slow rank 2."""
    gather = fp(op="gather", root=1, seq=3)
    records = {0: rec(0, None, state="exited", recent=[replace(gather, state=CallState.DONE)]),
               1: rec(1, gather, 2.0), 2: rec(2, None, stack=[["/job/train.py", 30, "slow_step", None]])}
    assert decide(records, 3, dead=set(), grace=1.0, hang_after=300) is None


def test_matching_ranks_in_the_same_collective_are_fine() -> None:
    records = {0: rec(0, fp(), 2.0), 1: rec(1, fp(), 2.0)}
    assert decide(records, 2, dead=set(), grace=1.0, hang_after=300) is None


def test_a_rank_that_died_failing_in_a_collective_is_not_blamed_over_the_rank_whose_death_caused_it() -> None:
    """4 ranks, rank 1 SIGKILLed: ranks 0 and 2 fail in the all_reduce with "Connection reset by peer" and
    torchrun stops them; the launcher reads their exit records (dead, with an error) in directory order.
    Rank 0's death is the consequence; rank 1's is the cause."""
    def failed(seq: int) -> CallRecord:
        return fp(seq=seq, state="failed")

    error = "RuntimeError: Read error [127.0.0.1]:908: Connection reset by peer"
    records = {
        2: rec(2, failed(5), 0.0, recent=[fp(seq=4, state="done")], state="dead", error=error),
        0: rec(0, failed(5), 0.0, recent=[fp(seq=4, state="done")], state="dead", error=error),
        3: rec(3, fp(seq=5), 0.0, recent=[fp(seq=4, state="done")], state="stopped"),
        1: rec(1, None, recent=[fp(seq=4, state="done")], state="dead", exit_status=9),
    }
    verdict = decide(records, 4, dead=set(), grace=0.0, hang_after=float("inf"))
    assert verdict is not None and verdict.class_ == "dead-rank"
    assert verdict.headline.startswith("rank 1 died (killed by SIGKILL"), verdict.headline
    assert verdict.headline.split(" while ")[1].startswith("rank 0 waits")  # the lowest of equal waiters
