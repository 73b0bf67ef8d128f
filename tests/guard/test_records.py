"""Rank records rebuilt or refreshed from the files ranks leave on this host."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from ddpdoctor.guard.fingerprint import CollectiveFingerprint, CollectiveSignature
from ddpdoctor.guard.host import this_host
from ddpdoctor.guard.judge.records import refresh_from_flight
from ddpdoctor.guard.rank.flight import FlightFile
from ddpdoctor.records import CallState, Frame, RankRecord

SITE = Frame("/job/train.py", 24, "main", None)


def _call(index: int) -> CollectiveFingerprint:
    signature = CollectiveSignature("0", "all_reduce", "SUM", None, [[8]], ["float32"], ["cpu"], SITE, None)
    return CollectiveFingerprint(index, index - 1, time.time() - 0.5, signature)


def _record(rank: int, flight: Path, done: CollectiveFingerprint) -> RankRecord:
    """A record published at a heartbeat, after `done` returned and before the rank's next call."""
    done.state = "done"
    return RankRecord(rank, pid=1, host=this_host(), hb=3, recent=(done.record(),), flight=str(flight),
                      stack=(Frame("/job/train.py", 30, "main", None),))


def test_a_live_peers_stale_record_is_brought_up_to_the_call_its_flight_file_shows(tmp_path: Path) -> None:
    """Rank 1 dies; rank 0's post-mortem reads rank 3's record, published before rank 3 entered the
    all_reduce that rank 1's death broke: its row said "running, not in a collective"."""
    flight = FlightFile(str(tmp_path / "rank-3.flight"), slots=8)
    done, entered = _call(5), _call(6)
    flight.enter(done)
    flight.finish(done, True)
    flight.enter(entered)
    records = refresh_from_flight({3: _record(3, tmp_path / "rank-3.flight", done)}, this_host(), skip=set())
    current = records[3].current
    assert current is not None and (current.index, current.op, current.state) == (
        6,
        "all_reduce",
        CallState.IN,
    )
    assert records[3].waited is not None and 0.4 < records[3].waited < 60
    assert records[3].stack == ()  # taken before the call: it would show where the rank was then


def test_a_record_that_knows_the_latest_call_and_ranks_of_another_host_are_left_alone(tmp_path: Path) -> None:
    for rank in (2, 4):
        flight = FlightFile(str(tmp_path / f"rank-{rank}.flight"), slots=8)
        done = _call(5)
        flight.enter(done)
        flight.finish(done, True)
        if rank == 4:
            flight.enter(_call(6))  # in a call, but its pid and files mean nothing on this host
    records = {2: _record(2, tmp_path / "rank-2.flight", _call(5)),
               4: replace(_record(4, tmp_path / "rank-4.flight", _call(5)), host="another-node/0/0")}
    assert refresh_from_flight(records, this_host(), skip=set()) == records


def test_a_record_of_a_failed_call_stands_though_the_rank_went_on(tmp_path: Path) -> None:
    """Every rank caught gloo's refusal of a float8 all_reduce: a peer's post-mortem record says its call
    failed, and that failure is what the judge compares, even once the peer has entered its next call."""
    flight = FlightFile(str(tmp_path / "rank-1.flight"), slots=8)
    refused, following = _call(5), _call(6)
    flight.enter(refused)
    flight.finish(refused, False)
    flight.enter(following)
    refused.state = "failed"
    record = replace(_record(1, tmp_path / "rank-1.flight", _call(4)), current=refused.record(),
                     error="RuntimeError: unsupported dtype")
    records = refresh_from_flight({1: record}, this_host(), skip=set())
    current = records[1].current
    assert current is not None and current.index == 5 and current.state is CallState.FAILED


def test_a_live_peer_whose_flight_file_shows_the_broken_call_failed_is_shown_failed_in_it(
    tmp_path: Path,
) -> None:
    """4 ranks, rank 1 SIGKILLed: rank 2's all_reduce failed on the reset connection too, but rank 0's
    post-mortem read rank 2's record before rank 2 published its own: its row said "running, not in a
    collective" (2 of 6 runs). Its flight file, and the exit record it wrote as it died, say otherwise."""
    flight = FlightFile(str(tmp_path / "rank-2.flight"), slots=8)
    done, broken = _call(5), _call(6)
    flight.enter(done)
    flight.finish(done, True)
    flight.enter(broken)
    flight.finish(broken, False)
    (tmp_path / "rank-2.exit.json").write_text(
        '{"error": "RuntimeError: Connection reset by peer", "seqs": {"0": 6}}'
    )
    records = refresh_from_flight({2: _record(2, tmp_path / "rank-2.flight", done)}, this_host(), skip=set())
    current = records[2].current
    assert current is not None and (current.index, current.state) == (6, CallState.FAILED)
    assert records[2].error == "RuntimeError: Connection reset by peer" and records[2].waited == 0.0
