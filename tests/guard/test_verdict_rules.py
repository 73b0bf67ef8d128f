"""Each rule of the judge on its own, in the order `verdict.RULES` applies them: what it decides, and what it
leaves to the rules after it."""

from __future__ import annotations

from dataclasses import replace

from record_builders import fp, rec

from ddpdoctor.guard.judge.verdict import (
    RULES,
    Decision,
    Waiter,
    decide,
    earlier_mismatch,
    peer_left,
    peer_passed_outside_python,
    peers_elsewhere,
    same_position_mismatch,
)
from ddpdoctor.records import RankRecord, RankStatus


def waiter(records: dict[int, RankRecord], rank: int = 0, hang_after: float = 300.0,
           dead: frozenset[int] = frozenset()) -> Waiter:
    record = records[rank]
    assert record.current is not None
    return Waiter(rank, record, record.current, records, max(records) + 1, dead, hang_after)


def test_the_rules_run_in_the_documented_order() -> None:
    assert RULES == (earlier_mismatch, same_position_mismatch, peer_passed_outside_python, peer_left,
                     peers_elsewhere)


def test_earlier_mismatch_finds_the_first_completed_call_that_differs() -> None:
    """Two Lightning metrics synced against each other: gloo completed both calls, the hang comes later."""
    ours = [fp(seq=1, state="done"), fp(seq=2, state="done")]
    theirs = [fp(seq=1, state="done"), fp(seq=2, state="done", reduce_op="MAX")]
    records = {0: rec(0, fp(seq=3), 2.0, recent=ours), 1: rec(1, None, recent=theirs)}
    verdict = earlier_mismatch(waiter(records))
    assert verdict is not None and verdict.decision is Decision.COMPLETED_MISMATCH
    assert (verdict.seq, verdict.mismatch) == (2, ("reduce_op",))
    assert verdict.headline.endswith("the backend completed it anyway, so results differ between ranks)")
    same = {0: records[0], 1: rec(1, None, recent=ours)}
    assert earlier_mismatch(waiter(same)) is None


def test_earlier_mismatch_ignores_calls_that_raised() -> None:
    records = {0: rec(0, fp(seq=3), 2.0, recent=[fp(seq=2, state="failed")]),
               1: rec(1, None, recent=[fp(seq=2, state="done", shapes=[(9,)])])}
    assert earlier_mismatch(waiter(records)) is None


def test_same_position_mismatch_compares_the_peers_call_at_this_seq() -> None:
    records = {0: rec(0, fp(dtype="float32"), 1.0), 1: rec(1, fp(dtype="float16"), 1.0)}
    verdict = same_position_mismatch(waiter(records))
    assert verdict is not None and verdict.decision is Decision.MISMATCH and verdict.mismatch == ("dtypes",)
    assert verdict.headline.startswith("dtype mismatch: rank 0")
    elsewhere = {
        0: records[0],
        1: rec(1, fp(seq=4, dtype="float16"), 1.0),
    }  # another position: not this rule's
    assert same_position_mismatch(waiter(elsewhere)) is None


def test_same_position_mismatch_names_two_roots_of_one_broadcast() -> None:
    """The verdict of tests/guard/test_run_jobs.py's 2-rank `root` job (a slow test), on its records."""
    records = {0: rec(0, fp(op="broadcast", root=0, reduce_op=None), 1.0),
               1: rec(1, fp(op="broadcast", root=1, reduce_op=None), 1.0)}
    verdict = same_position_mismatch(waiter(records))
    assert verdict is not None and verdict.decision is Decision.MISMATCH and verdict.mismatch == ("root",)
    assert verdict.headline.startswith(
        "root mismatch: rank 0 broadcast(root=0) [4] float32 vs rank 1 broadcast(root=1) [4] float32"
    ), verdict.headline


BACKWARD = [["/venv/site-packages/torch/autograd/graph.py", 979, "_engine_run_backward", "torch"],
            ["/job/train.py", 30, "<module>", None]]


def test_a_peer_past_the_seq_is_judged_only_from_a_record_with_its_history() -> None:
    history = rec(1, None, recent=[fp(seq=2, state="done")], seqs={"0": 6})
    heartbeat = replace(history, recent=None)  # an ordinary heartbeat: no history published
    records = {0: rec(0, fp(seq=3), 2.0, seqs={"0": 3}), 1: history}
    verdict = peer_passed_outside_python(waiter(records))
    assert (
        verdict is not None and verdict.decision is Decision.PASSED_OUTSIDE_PYTHON and verdict.peers == (1,)
    )
    assert "already passed #3 with a collective issued outside Python" in verdict.headline
    assert "got to #6" in verdict.headline
    assert peer_passed_outside_python(waiter({**records, 1: heartbeat})) is None


def test_a_peer_stopped_before_it_said_it_reached_gloos_abort_is_taken_as_there() -> None:
    """Rank 0 died of gloo's abort in its Python all_reduce #3; rank 1, whose collectives all come from C++
    (DDP's gradients), was stopped by the launcher before its record showed #3. gloo aborts on a message a
    peer sent for that position, so rank 1 issued #3 outside Python. An abort on CUDA tensors (NCCL's
    watchdog aborts on a timeout too) or a rank 1 that issued #3 from Python says nothing of the kind."""
    dead = rec(0, fp(seq=3), 0.0, state="dead", signal="SIGABRT", seqs={"0": 3})
    stopped = rec(1, None, recent=[], seqs={"0": 2}, python_seqs={"0": ()}, history_complete=True)
    verdict = peer_passed_outside_python(waiter({0: dead, 1: stopped}))
    assert verdict is not None and verdict.decision is Decision.PASSED_OUTSIDE_PYTHON, verdict
    assert "rank 0 was in all_reduce(SUM) [4] float32" in verdict.headline
    assert "rank 1's #3 is a collective issued outside Python" in verdict.headline
    on_cuda = replace(dead, current=replace(dead.current, devices=("cuda:0",)))
    assert peer_passed_outside_python(waiter({0: on_cuda, 1: stopped})) is None
    from_python = replace(stopped, python_seqs={"0": (3,)})
    assert peer_passed_outside_python(waiter({0: dead, 1: from_python})) is None
    killed = replace(dead, signal="SIGKILL")
    assert peer_passed_outside_python(waiter({0: killed, 1: stopped})) is None


def test_the_uneven_batches_advice_needs_a_peer_in_an_extra_backward() -> None:
    """The fix follows the evidence: a peer seen in backward (DDP's gradient all_reduce of a step the waiting
    rank did not run) is uneven iteration; a peer whose stack says nothing gets the advice naming every
    cause."""
    records = {0: rec(0, fp(seq=3), 2.0, seqs={"0": 3}),
               1: rec(1, None, recent=[fp(seq=2, state="done")], seqs={"0": 6}, stack=BACKWARD)}
    verdict = peer_passed_outside_python(waiter(records))
    assert verdict is not None and verdict.advice == "uneven-steps"
    unknown = {**records, 1: replace(records[1], stack=())}
    verdict = peer_passed_outside_python(waiter(unknown))
    assert verdict is not None and verdict.advice is None


def test_a_dead_peer_is_blamed_before_one_that_died_of_the_broken_collective() -> None:
    victim = rec(
        1, fp(seq=3, state="failed"), 0.0, state="dead", error="RuntimeError: Connection reset by peer"
    )
    cause = rec(2, None, recent=[fp(seq=2, state="done")], state="dead", exit_status=9)
    records = {0: rec(0, fp(seq=3), 2.0), 1: victim, 2: cause}
    verdict = peer_left(waiter(records))
    assert verdict is not None and verdict.decision is Decision.PEER_DEAD and verdict.cause == (2,)
    assert verdict.advice == "killed"
    assert verdict.rows[2].status is RankStatus.DEAD


def test_an_exited_peer_is_blamed_only_if_it_never_made_the_call() -> None:
    left = rec(1, None, state="exited", recent=[fp(seq=2, state="done")])
    made_it = rec(1, None, state="exited", recent=[fp(seq=3, state="done")])
    records = {0: rec(0, fp(seq=3), 2.0), 1: left}
    verdict = peer_left(waiter(records))
    assert verdict is not None and verdict.decision is Decision.PEER_EXITED and verdict.peers == (1,)
    assert peer_left(waiter({**records, 1: made_it})) is None


def test_peers_elsewhere_wait_for_hang_after_and_name_what_the_peer_does() -> None:
    running = rec(1, None, stack=[["/job/train.py", 42, "evaluate", None]])
    in_other = rec(1, fp(seq=4, op="broadcast", root=0), 2.0)
    records = {0: rec(0, fp(seq=3), 10.0), 1: running}
    assert peers_elsewhere(waiter(records, hang_after=30.0)) is None
    verdict = peers_elsewhere(waiter(records, hang_after=5.0))
    assert verdict is not None and verdict.decision is Decision.PEERS_ELSEWHERE
    assert verdict.class_ == "collective-timeout"
    verdict = peers_elsewhere(waiter({**records, 1: in_other}, hang_after=5.0))
    assert verdict is not None and verdict.decision is Decision.PEER_IN_OTHER_COLLECTIVE
    assert verdict.class_ == "collective-divergence" and verdict.decision.weak


def test_every_rank_in_the_call_for_hang_after_is_stuck() -> None:
    records = {0: rec(0, fp(), 10.0), 1: rec(1, fp(), 9.0)}
    verdict = peers_elsewhere(waiter(records, hang_after=5.0))
    assert verdict is not None and verdict.decision is Decision.ALL_STUCK
    assert verdict.headline == (
        "every rank is in all_reduce(SUM) [4] float32 (collective #3 of group 0) and none has "
        "completed it for 10 s"
    )


def test_the_decision_is_the_findings_kind_and_the_rows_status_its_state() -> None:
    records = {0: rec(0, fp(), 2.0), 1: rec(1, None, state="exited", recent=[fp(seq=2, state="done")])}
    verdict = decide(records, 3, dead=set(), grace=1.0, hang_after=300)
    assert verdict is not None
    facts = verdict.finding().facts
    assert facts["kind"] == "exited" and facts["missing"] == [1]
    assert [verdict.rows[r].status for r in range(3)] == [RankStatus.IN_COLLECTIVE, RankStatus.EXITED,
                                                          RankStatus.NO_RECORD]
    assert all(verdict.rows[r].status.gone for r in (1, 2)) and not verdict.rows[0].status.gone
