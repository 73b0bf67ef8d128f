"""A rank's flight file read back (by its peers' judge, the launcher and the report): the file's layout,
shared with `rank/flight.py`, which writes it (see that module for why there is a file).

Layout: a file header (`MAGIC`, the slot count), then one fixed-size *slot header* per slot, packed
together at the start of the file, `<state byte><index: int64><seq: int64><time: float64>`
(little-endian), then the slots' bodies, each on its own `BODY_SIZE` bytes from the first page boundary on:
the signature's JSON object and a newline (whatever follows the newline is what was left of a longer,
older record). Slot `index % slots` holds one fingerprint. The state byte is `E` (entered), `D` (done)
or `X` (raised); completing a call rewrites only that byte.
"""

from __future__ import annotations

import json
import struct

from ...records import CallRecord

MAGIC = b"DDPDFLT2"
FILE_HEADER = struct.Struct("<8sq")  # MAGIC, slots
HEADER = struct.Struct("<cqqd")  # state, index, seq, time (seconds since the epoch)
HEADER_STRIDE = 32  # a slot header, padded: two per 64-byte cache line
FIRST_HEADER = 64  # the slot headers start after one cache line of file header
BODY_SIZE = 1024
_PAGE = 4096
_STATES = {"E": "in", "D": "done", "X": "failed"}


def first_body(slots: int) -> int:
    """Where slot 0's body starts: the first page boundary after the slot headers."""
    return -(-(FIRST_HEADER + slots * HEADER_STRIDE) // _PAGE) * _PAGE


def read_flight(path: str) -> list[CallRecord]:
    """The fingerprints in a flight file, oldest first; unreadable slots are skipped."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    if len(data) < FILE_HEADER.size:
        return []
    magic, slots = FILE_HEADER.unpack_from(data, 0)
    if magic != MAGIC or not 0 < slots <= len(data) // BODY_SIZE:
        return []
    bodies = first_body(slots)
    out = []
    for slot in range(slots):
        start = FIRST_HEADER + slot * HEADER_STRIDE
        state, index, seq, when = HEADER.unpack_from(data, start)
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
