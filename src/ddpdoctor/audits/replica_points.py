"""F12 replica-divergence: the forward passes at which every rank digests a DDP model besides the doubling
schedule of replicas.py, agreed through the job's store, and the store work of the digests, all on a thread
of their own (the training thread only computes a digest, at a pass every rank names alike).

Rank 0 names a point every `DDPDOCTOR_DIGEST_INTERVAL` seconds (`ddpdoctor run --digest-every`; default
300, 0: never) and after each checkpoint save on rank 0 (the save's digest must be what every replica
holds): a pass `margin` beyond its own count, far enough that the other ranks, polling every `POLL_S`, hear
of it before they get there (the margin grows with rank 0's pass rate). A rank already past a point skips
it: the next one is compared. A clock on each rank would not do: the same second is a different pass on
each rank, and a digest is comparable only at the same pass.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable

from ..failsafe import failsafe
from .context import StoreClient

ENV_INTERVAL = "DDPDOCTOR_DIGEST_INTERVAL"
DEFAULT_INTERVAL_S = 300.0
POLL_S = 0.5  # one store read per rank per POLL_S, as the heartbeat
MIN_MARGIN = 4


def interval_from_env() -> float:
    try:
        value = float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value > 0 and math.isfinite(value) else 0.0


class DigestPoints:
    """One DDP model's agreed digest points (pass number -> why), and the thread that agrees on them and
    runs the store work handed to it (`submit`)."""

    def __init__(
        self,
        store: StoreClient,
        key: str,
        rank: int,
        lock: threading.Lock,
        forwards: Callable[[], int],
        interval: float,
    ) -> None:
        self.store = store
        self.key = key  # the model's prefix in the store: points are `<key><n>`
        self.rank = rank
        self.lock = lock
        self.forwards = forwards
        self.interval = interval
        self.points: dict[int, str] = {}  # read by the training thread's hook (dict.get: atomic)
        self._named = 0
        self._requests: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-replica-points", daemon=True)
        self._last = time.monotonic()
        self._rate: tuple[float, int] = (self._last, 0)

    def start(self) -> None:
        self._thread.start()

    def request(self, why: str) -> None:
        """Name a point soon (rank 0: after a checkpoint save)."""
        if self.rank == 0:
            self._requests.put(why)

    def submit(self, work: Callable[[], None]) -> None:
        self._work.put(work)

    def stop(self) -> None:
        """Stop the thread and run what it had not done yet, here."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * POLL_S + 1.0)
        self._drain()

    # ---- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            done = False
            with failsafe("replica points: a round"):
                self._drain()
                if self.rank == 0:
                    self._name_points()
                else:
                    self._hear_points()
                done = True
            if not done:
                return  # the store is gone (the job ends, or it broke): the end's digest still runs

    def _drain(self) -> None:
        while True:
            try:
                work = self._work.get_nowait()
            except queue.Empty:
                return
            with failsafe("replica points: publishing or comparing a digest"):
                work()

    def _name_points(self) -> None:
        now = time.monotonic()
        why = None
        while True:
            try:
                why = self._requests.get_nowait()
            except queue.Empty:
                break
        if why is None and self.interval and now - self._last >= self.interval:
            why = f"on the {self.interval:g} s clock"
        count = self.forwards()
        then, before = self._rate
        self._rate = (now, count)
        if why is None:
            return
        rate = (count - before) / max(now - then, 1e-3)
        point = count + max(MIN_MARGIN, math.ceil(rate * 3 * POLL_S))
        self._last = now
        self.points[point] = why
        with self.lock:
            self.store.set(f"{self.key}{self._named}", json.dumps({"pass": point, "why": why}))
        self._named += 1

    def _hear_points(self) -> None:
        while True:
            key = f"{self.key}{self._named}"
            with self.lock:
                if not self.store.check([key]):
                    return
                data = json.loads(self.store.get(key))
            self.points[int(data["pass"])] = str(data["why"])
            self._named += 1
