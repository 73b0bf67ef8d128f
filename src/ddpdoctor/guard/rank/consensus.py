"""Cross-rank agreement on collectives that *complete* despite a mismatch.

gloo finishes an all_reduce whose ranks passed different ReduceOps (SUM on one, MAX on another) without
any error: nobody waits, so the waiting-rank comparison never runs. Each rank therefore folds the
collectives of every group, in order, into a hash chain and at every `SEGMENT`-th collective queues a
checkpoint. The segment is hashed once, when it is full. The monitor publishes it with `compare_set` on
a key named after (group, count): the first rank to arrive writes it, every later rank gets the stored
value back and compares. O(1) store operations per rank per
checkpoint, no reads of N keys. The value carries the segment's fingerprints, so a mismatch names the
exact collective and both call sites.

The caller's thread only writes each fingerprint into the call ring (call_ring.py, a slot store); the
monitor folds the calls written since its last heartbeat into the chains. Folding on the hot path cost
7 µs per collective in a 2-rank gloo loop, where the caches are cold after every collective, against under
1 µs per fingerprint folded in a batch.
"""

from __future__ import annotations

import collections
import hashlib
import json
import operator
import time
from typing import Any

from ...failsafe import failsafe
from ..fingerprint import COMPARED, P2P_OPS, CollectiveFingerprint
from ..judge.checkpoints import Checkpoint
from ..protocol import StoreKeys
from .call_ring import MASK, SLOTS, CallRing

SEGMENT = 8
FOLD_BATCH = 256  # collectives folded at a time
# Seconds the fold holds the GIL before it lets go between two batches (a release is a system call and a
# switch of threads: once per batch, it cost more than the batches themselves once they were C loops)
HOLD_GIL_FOR = 100e-6
_KEEP = 8  # checkpoints a writer keeps before deleting its old keys
_SIGNATURE = operator.attrgetter("signature")
_STATE = operator.attrgetter("state")
_METRIC = operator.attrgetter("metric")
_CHAINED = operator.attrgetter("signature.chain")  # _chained(fp) of a call that syncs no metric


def _compact(fp: CollectiveFingerprint) -> dict[str, Any]:
    data = fp.record().to_json()
    return {k: data.get(k) for k in ("index", "group", "seq", *COMPARED, "site", "library", "metric")}


def _chained(fp: CollectiveFingerprint) -> bytes:
    """A collective's share of the chain: its signature's, plus the Lightning metric it syncs, if any."""
    if fp.metric is None:
        return fp.signature.chain
    return fp.signature.chain + fp.metric.name.encode() + b";"


class _Chain:
    __slots__ = ("count", "digest", "segment", "hasher")

    def __init__(self) -> None:
        self.count = 0
        self.digest = b""
        self.segment: collections.deque[CollectiveFingerprint] = collections.deque(maxlen=SEGMENT)
        # The hash of every call up to the last checkpoint, in order (a running hash: a checkpoint's digest
        # is a copy of it, so a fold hashes the calls between the checkpoints it publishes in one go).
        self.hasher = hashlib.blake2b(digest_size=8)


class ChainCheck:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.chains: dict[str, _Chain] = {}
        # (group, count, digest, fingerprints) waiting for the monitor; only the newest few matter
        self.pending: collections.deque[tuple[str, int, bytes, list[CollectiveFingerprint]]] = (
            collections.deque(maxlen=4)
        )
        self.written: list[str] = []
        self.folded = 0  # the index (CallRing) of the last call folded
        self.broken = False

    def fold(self, ring: CallRing, current: CollectiveFingerprint | None, newest: int | None = None) -> None:
        """Add the calls written to `ring` since the last fold to their groups' chains, in the order issued,
        up to `current`, the call the caller's thread is still inside: only calls that returned are compared
        (one still waiting is the waiting-rank comparison's). `newest`, the ring's count read before
        `current` was, bounds the fold: a call written after that may be in progress. Point-to-point ops
        and calls that raised are left out.

        The calls are taken FOLD_BATCH at a time, and the GIL let go between batches once it was held
        HOLD_GIL_FOR: a heartbeat after a burst of small collectives folds thousands. A batch of one group's
        calls with nothing to leave out (the common case) is folded by C loops (slices, `map`, `bytes.join`,
        one running hash): Python runs per batch and per published checkpoint, not per call (the per-call
        loop cost about 2 µs of the GIL a call)."""
        if newest is None:
            newest = ring.count
        index = max(self.folded, ring.start)
        if newest - index > SLOTS:  # the oldest unfolded calls were overwritten: skip to what is left
            self.broken = True
            index = newest - SLOTS
        held_since = time.perf_counter()
        while index < newest:
            first = (index + 1) & MASK
            stop = min(newest, index + FOLD_BATCH, index + SLOTS - first)  # a batch does not wrap around
            batch = ring.slots[first : first + stop - index]
            # the call in progress, if it is among these: its index says where
            reached = current is not None and index < current.index <= stop and (
                batch[current.index - index - 1] is current
            )
            if reached:
                assert current is not None
                del batch[current.index - index - 1 :]
                stop = index + len(batch)
            if not (batch and self._fold_batch(ring, batch, index, newest)):
                stop = self._fold_each(ring, current, index, stop)
                reached = reached or stop < index + len(batch)
            index = stop
            self.folded = index
            if reached:
                break
            if index < newest and time.perf_counter() - held_since > HOLD_GIL_FOR:
                time.sleep(0)  # let the training thread have the GIL
                held_since = time.perf_counter()

    def _fold_batch(self, ring: CallRing, batch: list, index: int, newest: int) -> bool:
        """Fold `batch`, the calls index+1.. in order, if it is one group's calls with nothing to leave out
        and its slots hold what they should; False, folding nothing, otherwise."""
        slots, keep, start = ring.slots, ring.keep, ring.start
        # Calls are written in index order, so the first slot intact means every later one is; the history
        # let go below cannot share a slot with an unfolded call while the two fit the ring together.
        head = batch[0]
        if head is None or head.index != index + 1 or newest - index + keep >= SLOTS:
            return False
        count = len(batch)
        try:
            signatures = list(map(_SIGNATURE, batch))
        except AttributeError:  # a slot emptied (the ring cleared for a new group)
            return False
        # nearly always one signature: the same line, the same tensors (count() compares by identity first)
        same = head.signature if signatures.count(head.signature) == count else None
        distinct = (same,) if same is not None else set(signatures)
        group = head.signature.group
        if any(signature.group != group or signature.op in P2P_OPS for signature in distinct):
            return False
        if "failed" in map(_STATE, batch) or list(map(_METRIC, batch)).count(None) != count:
            return False
        # The calls `keep` before these are out of the history (`recent`) and now folded: let them go, so
        # that a long job keeps `keep` calls alive, not SLOTS.
        low, high = max(index + 1 - keep, start + 1), index + count - keep  # indices let go, inclusive
        if low <= high:
            a, b = low & MASK, high & MASK
            if a <= b:
                slots[a : b + 1] = [None] * (b - a + 1)
            else:
                slots[a:] = [None] * (SLOTS - a)
                slots[: b + 1] = [None] * (b + 1)
        chain = self.chains.get(group)
        if chain is None:
            chain = self.chains[group] = _Chain()
        # The calls since the chain's last checkpoint, then the batch's: a checkpoint every SEGMENT of them.
        tail = chain.count % SEGMENT
        if tail:
            folded = list(chain.segment)
            calls = folded[len(folded) - tail :] + batch
        else:
            calls = batch
        checkpoints = len(calls) // SEGMENT
        # Only the newest few checkpoints stay queued (self.pending's length): the calls up to those are
        # hashed in one update.
        skip = max(0, checkpoints - (self.pending.maxlen or checkpoints))
        hasher = chain.hasher
        if same is not None and all(fp.signature is same for fp in calls[:tail]):
            unit: bytes | None = same.chain  # every call's share of the hash: repeated, not gathered
        else:
            unit = None
        if skip:
            hasher.update(unit * skip * SEGMENT if unit else b"".join(map(_CHAINED, calls[: skip * SEGMENT])))
        for at in range(skip * SEGMENT, checkpoints * SEGMENT, SEGMENT):
            fps = calls[at : at + SEGMENT]
            hasher.update(unit * SEGMENT if unit else b"".join(map(_CHAINED, fps)))
            chain.digest = hasher.copy().digest()
            self.pending.append((group, chain.count - tail + at + SEGMENT, chain.digest, fps))
        chain.count += count
        chain.segment.extend(batch[-SEGMENT:])
        return True

    def _fold_each(self, ring: CallRing, current: CollectiveFingerprint | None, index: int, stop: int) -> int:
        """Fold the calls index+1..stop one by one, up to `current`; the index of the last one folded."""
        chains = self.chains
        slots, keep, start = ring.slots, ring.keep, ring.start
        while index < stop:
            fp = slots[(index + 1) & MASK]  # ring.at(index + 1), inlined
            if fp is None or fp.index != index + 1:  # overwritten: more than SLOTS calls since the last fold
                self.broken = True  # comparing now could only raise false alarms
                index += 1
                continue
            if fp is current:
                break
            index += 1
            # The call `keep` before this one is out of the history (`recent`) and now folded: let it go,
            # so that a long job keeps `keep` calls alive, not SLOTS.
            gone = index - keep
            if gone > start:
                old = slots[gone & MASK]
                if old is not None and old.index == gone:
                    slots[gone & MASK] = None
            signature = fp.signature
            if fp.state == "failed" or signature.op in P2P_OPS:
                continue
            chain = chains.get(signature.group)  # self.update(fp), inlined
            if chain is None:
                chain = chains[signature.group] = _Chain()
            chain.count += 1
            chain.segment.append(fp)
            if chain.count % SEGMENT == 0:
                self._checkpoint(signature.group, chain, SEGMENT)
        return index

    def update(self, fp: CollectiveFingerprint) -> None:
        """Add one collective to its group's chain (hashing waits for the segment to fill)."""
        chain = self.chains.get(fp.group)
        if chain is None:
            chain = self.chains[fp.group] = _Chain()
        chain.count += 1
        chain.segment.append(fp)
        if chain.count % SEGMENT == 0:
            self._checkpoint(fp.group, chain, SEGMENT)

    def flush(self) -> None:
        """At exit: checkpoint every chain where it stands, so short jobs are compared too."""
        for group, chain in self.chains.items():
            if chain.count % SEGMENT:
                self._checkpoint(group, chain, chain.count % SEGMENT)

    def _checkpoint(self, group: str, chain: _Chain, new: int) -> None:
        """Fold the `new` newest collectives into the digest, in order, and queue the checkpoint."""
        fps = list(chain.segment)
        chain.hasher.update(b"".join(_chained(fp) for fp in fps[len(fps) - new :]))
        chain.digest = chain.hasher.copy().digest()
        self.pending.append((group, chain.count, chain.digest, fps))

    def publish(self, store: Any, keys: StoreKeys) -> tuple[Checkpoint, Checkpoint] | None:
        """compare_set each queued checkpoint; (ours, theirs) for the first that disagrees."""
        if self.broken:
            self.pending.clear()
            return None
        while self.pending:
            group, count, digest, fps = self.pending.popleft()
            value = json.dumps(
                {"rank": self.rank, "h": digest.hex(), "fps": [_compact(fp) for fp in fps]},
                separators=(",", ":"),
            )
            key = keys.chain(group, count)
            stored = store.compare_set(key, "", value).decode()
            if stored == value:
                self.written.append(key)
                if len(self.written) > _KEEP:
                    old = self.written.pop(0)
                    with failsafe("consensus.publish"):  # cleanup only
                        store.delete_key(old)
                continue
            ours, theirs = Checkpoint.from_json(json.loads(value)), Checkpoint.from_json(json.loads(stored))
            if ours.digest != theirs.digest:
                return ours, theirs
        return None
