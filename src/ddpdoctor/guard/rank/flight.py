"""The per-rank flight file: the last N fingerprints, written before each collective runs.

Why a file: gloo answers a shape mismatch by aborting the receiving process (SIGABRT, within
milliseconds), so nothing in that process's memory survives and its monitor may never get to publish.
The file is mapped shared (`mmap`): a store into the mapping lands in the page cache, survives the abort,
and costs a memory copy instead of a system call (a `pwrite` cost 4 µs in a tight loop and 16 µs right
after a training step's backward pass), so the peers and the launcher can still read what the dead rank
was doing. Layout: `slots` fixed-size slots; slot `index % slots` holds one fingerprint as a header,
`<state byte><index: int64><seq: int64><time: float64>` (little-endian), then the signature's JSON object
and a newline (whatever follows the newline is what was left of a longer, older record). The state byte
is `E` (entered), `D` (done) or `X` (raised); completing a call rewrites only that byte.

Why a binary header: right after a collective the caches are cold and every Python operation costs
several times its tight-loop price (measured: the whole hot path 8x). A training loop issues the same few
signatures over and over, so a slot usually holds the signature it needs already, and entering a
collective is then one `pack_into` of the numbers; the signature's bytes are copied only when the slot
held another one.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any

from ..fingerprint import CollectiveFingerprint
from ..model import CallRecord

SLOT_SIZE = 1024
HEADER = struct.Struct("<cqqd")  # state, index, seq, time (seconds since the epoch)
_HEADER = HEADER
_STATES = {"E": "in", "D": "done", "X": "failed"}


class FlightFile:
    def __init__(self, path: str, slots: int) -> None:
        self.path = path
        self.slots = slots
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(self.fd, slots * SLOT_SIZE)
            self.map = mmap.mmap(
                self.fd, slots * SLOT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
        except (OSError, ValueError):
            os.close(self.fd)
            raise
        # The signature whose bytes each slot holds (compared by identity: signatures are interned).
        self.held: list[Any] = [None] * slots

    def enter(self, fp: CollectiveFingerprint) -> None:
        slot = fp.index % self.slots
        start = slot * SLOT_SIZE
        signature = fp.signature
        if self.held[slot] is not signature:
            # No padding: the reader stops at the newline. The state byte is cleared first so that a
            # process killed between the two writes leaves an unreadable slot, not a mislabelled one. The
            # signature's bytes are bounded (fingerprint.SIGNATURE_JSON_MAX), so this always fits.
            self.map[start] = 0
            body = signature.json + b"\n"
            at = start + _HEADER.size
            self.map[at : at + len(body)] = body
            self.held[slot] = signature
        _HEADER.pack_into(self.map, start, b"E", fp.index, fp.seq, fp.time)

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


def read_flight(path: str) -> list[CallRecord]:
    """The fingerprints in a flight file, oldest first; unreadable slots are skipped."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    out = []
    for start in range(0, len(data) - _HEADER.size + 1, SLOT_SIZE):  # every slot with a whole header
        state, index, seq, when = _HEADER.unpack_from(data, start)
        if state not in (b"E", b"D", b"X"):
            continue
        body = data[start + _HEADER.size : start + SLOT_SIZE].split(b"\n", 1)[0]
        try:
            fp = json.loads(body.decode("utf-8", "replace"))
        except ValueError:
            continue
        if not isinstance(fp, dict):
            continue
        fp.update(index=index, seq=seq, time=when, state=_STATES[state.decode()])
        out.append(CallRecord.from_json(fp))
    out.sort(key=lambda call: call.index)
    return out
