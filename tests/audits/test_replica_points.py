"""The digest points of replica_points.py between two ranks' threads through a real TCPStore (one process:
the agreement is the store's, not the job's): rank 0 names a pass a margin beyond its own count after a
save and on its clock; rank 1 hears of it; the store work handed to the thread runs there, or at stop."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest

torch_distributed = pytest.importorskip("torch.distributed")

from ddpdoctor.audits.replica_points import MIN_MARGIN, DigestPoints  # noqa: E402


def _store() -> object:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return torch_distributed.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=10))


def _until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_rank_0_names_a_point_after_a_save_and_rank_1_hears_it() -> None:
    store = _store()
    lock = threading.Lock()
    zero = DigestPoints(store, "p/0/", 0, lock, lambda: 40, interval=0.0)
    one = DigestPoints(store, "p/0/", 1, lock, lambda: 41, interval=0.0)
    ran: list[str] = []
    zero.start()
    one.start()
    try:
        zero.request("the first comparison after the checkpoint save at train.py:30")
        one.submit(lambda: ran.append(threading.current_thread().name))
        assert _until(lambda: bool(one.points))
        (point, why), = one.points.items()
        assert point >= 40 + MIN_MARGIN and zero.points == {point: why}
        assert why == "the first comparison after the checkpoint save at train.py:30"
        assert ran == ["ddpdoctor-replica-points"]  # the store work ran on the points' thread
    finally:
        zero.stop()
        one.stop()
    one.submit(lambda: ran.append("after stop"))
    one.stop()  # what is left runs at stop, on the caller's thread
    assert ran[-1] == "after stop"


def test_the_clock_names_points_and_a_rank_that_never_saves_names_none() -> None:
    store = _store()
    lock = threading.Lock()
    clock = DigestPoints(store, "c/0/", 0, lock, lambda: 7, interval=0.5)
    listener = DigestPoints(store, "c/0/", 1, lock, lambda: 7, interval=0.0)
    clock.start()
    listener.start()
    try:
        listener.request("a save on rank 1")  # only rank 0 names points
        assert _until(lambda: any("on the 0.5 s clock" in why for why in listener.points.values()))
    finally:
        clock.stop()
        listener.stop()
    assert all(why == "on the 0.5 s clock" for why in listener.points.values())
