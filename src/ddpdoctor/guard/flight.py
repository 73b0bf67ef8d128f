"""The per-rank flight file: the last N fingerprints, written before each collective runs.

Why a file: gloo answers a shape mismatch by aborting the receiving process (SIGABRT, within
milliseconds), so nothing in that process's memory survives and its monitor may never get to publish.
The file is mapped shared (`mmap`): a store into the mapping lands in the page cache, survives the abort,
and costs a memory copy instead of a system call (a `pwrite` cost 4 µs in a tight loop and 16 µs right
after a training step's backward pass), so the peers and the launcher can still read what the dead rank
was doing. Layout: `slots` fixed-size slots; slot `index % slots` holds one fingerprint as
`<state byte><JSON>\\n` (whatever follows the newline is what was left of a longer, older record). The
state byte is `E` (entered), `D` (done) or `X` (raised); completing a call rewrites only that byte.
"""

from __future__ import annotations

import json
import mmap
import os
from typing import Any

from .fingerprint import CollectiveFingerprint

SLOT_SIZE = 1024
_STATES = {"E": "in", "D": "done", "X": "failed"}


def encode(fp: CollectiveFingerprint) -> bytes:
    """A slot's JSON: the per-call numbers, then the signature's bytes, encoded once per signature. The
    time goes in as integer microseconds (`time_us`): formatting a float costs more than the rest."""
    return b'{"index":%d,"seq":%d,"time_us":%d,' % (fp.index, fp.seq, int(fp.time * 1e6)) + fp.signature.json


class FlightFile:
    def __init__(self, path: str, slots: int) -> None:
        self.path = path
        self.slots = slots
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(self.fd, slots * SLOT_SIZE)
            self.map = mmap.mmap(self.fd, slots * SLOT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            os.close(self.fd)
            raise

    def enter(self, fp: CollectiveFingerprint) -> None:
        # No padding: the reader stops at the newline, so a longer record left in the slot does not matter.
        # The signature's bytes are bounded (fingerprint.SIGNATURE_JSON_MAX), so this always fits.
        record = b"E" + encode(fp) + b"\n"
        start = (fp.index % self.slots) * SLOT_SIZE
        self.map[start : start + len(record)] = record

    def finish(self, fp: CollectiveFingerprint, ok: bool) -> None:
        self.map[(fp.index % self.slots) * SLOT_SIZE] = 68 if ok else 88  # b"D" / b"X"

    def close(self) -> None:
        try:
            self.map.close()
        except (OSError, ValueError, BufferError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


def read_flight(path: str) -> list[dict[str, Any]]:
    """The fingerprints in a flight file, oldest first; unreadable slots are skipped."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    out = []
    for start in range(0, len(data), SLOT_SIZE):
        slot = data[start : start + SLOT_SIZE]
        if not slot or slot[:1] not in (b"E", b"D", b"X"):
            continue
        try:
            fp = json.loads(slot[1:].split(b"\n", 1)[0].decode("utf-8", "replace"))
        except ValueError:
            continue
        fp["state"] = _STATES[slot[:1].decode()]
        if "time_us" in fp:
            fp["time"] = fp.pop("time_us") / 1e6
        out.append(fp)
    out.sort(key=lambda fp: fp.get("index", 0))
    return out
