"""The per-rank flight file: the last N fingerprints, written before each collective runs.

Why a file: gloo answers a shape mismatch by aborting the receiving process (SIGABRT, within
milliseconds), so nothing in that process's memory survives and its monitor may never get to publish.
The file is mapped shared (`mmap`): a store into the mapping lands in the page cache, survives the abort,
and costs a memory copy instead of a system call (a `pwrite` cost 4 µs in a tight loop and 16 µs right
after a training step's backward pass), so the peers and the launcher can still read what the dead rank
was doing.

Layout: a file header (`MAGIC`, the slot count), then one fixed-size *slot header* per slot, packed
together at the start of the file, `<state byte><index: int64><seq: int64><time: float64>`
(little-endian), then the slots' bodies, each on its own `BODY_SIZE` bytes from the first page boundary on:
the signature's JSON object and a newline (whatever follows the newline is what was left of a longer,
older record). Slot `index % slots` holds one fingerprint. The state byte is `E` (entered), `D` (done)
or `X` (raised); completing a call rewrites only that byte.

Why the headers together: a training loop issues the same few signatures over and over, so a slot usually
holds the signature it needs already, and entering a collective is then one `pack_into` of the numbers
into the header region, which is one page that every call writes: it stays in the caches and the TLB.
With the header beside each body (the layout before), consecutive calls wrote 16 different pages, and
right after a collective, when the caches are cold, that write cost more than the rest of the hot path's
bookkeeping together (measured in a one-rank gloo loop). The signature's bytes are copied only when the
slot held another one.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any

from ..fingerprint import CollectiveFingerprint
from ..model import CallRecord

MAGIC = b"DDPDFLT2"
_FILE_HEADER = struct.Struct("<8sq")  # MAGIC, slots
HEADER = struct.Struct("<cqqd")  # state, index, seq, time (seconds since the epoch)
HEADER_STRIDE = 32  # a slot header, padded: two per 64-byte cache line
FIRST_HEADER = 64  # the slot headers start after one cache line of file header
BODY_SIZE = 1024
_PAGE = 4096
_HEADER = HEADER


def first_body(slots: int) -> int:
    """Where slot 0's body starts: the first page boundary after the slot headers."""
    return -(-(FIRST_HEADER + slots * HEADER_STRIDE) // _PAGE) * _PAGE
_STATES = {"E": "in", "D": "done", "X": "failed"}


class FlightFile:
    def __init__(self, path: str, slots: int) -> None:
        self.path = path
        self.slots = slots
        self.bodies = first_body(slots)
        size = self.bodies + slots * BODY_SIZE
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            os.close(self.fd)
            raise
        _FILE_HEADER.pack_into(self.map, 0, MAGIC, slots)
        # The signature whose bytes each slot holds (compared by identity: signatures are interned).
        self.held: list[Any] = [None] * slots

    def enter(self, fp: CollectiveFingerprint) -> None:
        slot = fp.index % self.slots
        start = FIRST_HEADER + slot * HEADER_STRIDE
        signature = fp.signature
        if self.held[slot] is not signature:
            # No padding: the reader stops at the newline. The state byte is cleared first so that a
            # process killed between the two writes leaves an unreadable slot, not a mislabelled one. The
            # signature's bytes are bounded (fingerprint.SIGNATURE_JSON_MAX), so this always fits.
            self.map[start] = 0
            body = signature.json + b"\n"
            at = self.bodies + slot * BODY_SIZE
            self.map[at : at + len(body)] = body
            self.held[slot] = signature
        _HEADER.pack_into(self.map, start, b"E", fp.index, fp.seq, fp.time)

    def finish(self, fp: CollectiveFingerprint, ok: bool) -> None:
        self.map[FIRST_HEADER + (fp.index % self.slots) * HEADER_STRIDE] = 68 if ok else 88  # b"D" / b"X"

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
    if len(data) < _FILE_HEADER.size:
        return []
    magic, slots = _FILE_HEADER.unpack_from(data, 0)
    if magic != MAGIC or not 0 < slots <= len(data) // BODY_SIZE:
        return []
    bodies = first_body(slots)
    out = []
    for slot in range(slots):
        start = FIRST_HEADER + slot * HEADER_STRIDE
        state, index, seq, when = _HEADER.unpack_from(data, start)
        if state not in (b"E", b"D", b"X"):
            continue
        at = bodies + slot * BODY_SIZE
        body = data[at : at + BODY_SIZE].split(b"\n", 1)[0]
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
