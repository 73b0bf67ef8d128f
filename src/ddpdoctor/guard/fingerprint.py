"""The fingerprint of one collective call: what every rank of a group must agree on, plus where it came
from."""

from __future__ import annotations

import json
from typing import Any

from ..collectives import TORCH_DISTRIBUTED
from ..records import COMPARED, CallRecord, CallState, Frame, MetricOrigin

# Point-to-point ops pair with one peer, not with the whole group at the same sequence number.
P2P_OPS = frozenset(op.name for op in TORCH_DISTRIBUTED if op.p2p)

# Ops after which the group's sequence number is not the same on every rank: gloo counts a send or recv
# only on the two ranks involved, and builds monitored_barrier from them (rank 0 counts 2 per peer, the
# others 2). The runtime takes their increments out of each rank's numbering, so that the collectives
# after them still meet at the same number on every rank. (NCCL counts point-to-point ops apart.)
RENUMBERED_OPS = frozenset(op.name for op in TORCH_DISTRIBUTED if op.sequence_uneven)


def _short(frame: Frame | None) -> Frame | None:
    """A frame with its file name only and a bounded function name: fits a flight slot whatever the paths."""
    if frame is None:
        return None
    return frame._replace(path=frame.path.rsplit("/", 1)[-1][:200], function=frame.function[:100])


class CollectiveSignature:
    """What one call site issues, apart from its position in the sequence: op, arguments, tensor
    metadata and where it came from. A training loop issues the same few signatures over and over, so
    the runtime interns them and each is encoded once: the hot path then writes a few numbers and
    reuses these bytes (flight slot, checkpoint chain)."""

    __slots__ = (
        "group", "op", "reduce_op", "root", "shapes", "dtypes", "devices", "site", "library", "json", "chain",
        "on_gpu", "roles",
    )

    def __init__(
        self,
        group: str,
        op: str,
        reduce_op: str | None,
        root: int | None,
        shapes: list,
        dtypes: list,
        devices: list,
        site: Frame | None,
        library: Frame | None,
        roles: tuple[str, ...] = (),
    ) -> None:
        self.group = group
        self.roles = roles  # per shape: "in", "out", or "" for a tensor that is both
        self.op = op
        self.reduce_op = reduce_op
        self.root = root
        self.shapes = shapes
        self.dtypes = dtypes
        self.devices = devices
        self.site = site
        self.library = library
        # A flight slot's JSON object (index, seq and time go in the slot's binary header), and this
        # signature's share of the checkpoint chain's hash input.
        self.json = self._encode(shapes, dtypes, devices, site, library, roles)
        if len(self.json) > SIGNATURE_JSON_MAX:  # huge shape lists or paths: keep the slot valid JSON
            self.json = self._encode(shapes[:2], dtypes[:2], devices[:2], site, library, roles[:2])
        if len(self.json) > SIGNATURE_JSON_MAX:
            self.json = self._encode([], [], [], _short(site), _short(library), ())
        self.chain = f"{op}|{reduce_op}|{root}|{shapes}|{dtypes};".encode()
        # A call on CUDA tensors returns before the GPU has run it (NCCL): completion is tracked apart.
        self.on_gpu = any(device.startswith("cuda") for device in devices)

    def _encode(self, shapes: list, dtypes: list, devices: list, site: Frame | None, library: Frame | None,
                roles: tuple[str, ...]) -> bytes:
        fields: dict[str, Any] = {
            "group": self.group[:100], "op": self.op, "reduce_op": self.reduce_op, "root": self.root,
            "shapes": shapes, "dtypes": dtypes, "devices": devices,
            "site": site.to_list() if site else None, "library": library.to_list() if library else None}
        if roles:
            fields["roles"] = list(roles)
        return json.dumps(fields, separators=(",", ":")).encode()


# A flight slot's body is 1 KB (rank/flight.py); the signature and its newline must fit it.
SIGNATURE_JSON_MAX = 900


class CollectiveFingerprint:
    """One collective as this rank issued it: its signature, plus its place in this rank's sequence (index,
    the group's sequence number) and time. Built on the hot path, so: slots, no validation."""

    __slots__ = ("index", "seq", "time", "signature", "state", "metric")

    def __init__(self, index: int, seq: int, time: float, signature: CollectiveSignature) -> None:
        # The hot path (rank/calls.py, CallRecorder.before) sets these same attributes itself: keep the two
        # alike.
        self.index = index
        self.seq = seq
        self.time = time
        self.signature = signature
        self.state = "in"  # in | done | failed
        # Lightning syncs a logged metric long after `self.log` returned: which metric, and where it was
        # logged, set for collectives Lightning issues while syncing one.
        self.metric: MetricOrigin | None = None

    @property
    def group(self) -> str:
        return self.signature.group

    @property
    def op(self) -> str:
        return self.signature.op

    @property
    def reduce_op(self) -> str | None:
        return self.signature.reduce_op

    @property
    def root(self) -> int | None:
        return self.signature.root

    @property
    def shapes(self) -> list:
        return self.signature.shapes

    @property
    def dtypes(self) -> list:
        return self.signature.dtypes

    @property
    def devices(self) -> list:
        return self.signature.devices

    @property
    def site(self) -> Frame | None:
        return self.signature.site

    @property
    def library(self) -> Frame | None:
        return self.signature.library

    def record(self) -> CallRecord:
        """This call as the records, the flight file's reader and the report know it."""
        sig = self.signature
        return CallRecord(
            index=self.index,
            group=sig.group,
            seq=self.seq,
            op=sig.op,
            reduce_op=sig.reduce_op,
            root=sig.root,
            shapes=tuple(tuple(shape) for shape in sig.shapes),
            dtypes=tuple(sig.dtypes),
            devices=tuple(sig.devices),
            site=sig.site,
            library=sig.library,
            time=self.time,
            state=CallState(self.state),
            metric=self.metric,
            roles=tuple(sig.roles),
        )


class EnteredFingerprint(CollectiveFingerprint):
    """A CollectiveFingerprint as the wrapper's fast path makes it (rank/wrapper_importlib_bootstrap.py):
    called with no arguments, it runs object's own `__init__` (no Python frame, no argument tuple) and the
    caller sets every attribute, some 300 instructions less than `object.__new__(CollectiveFingerprint)`."""

    __slots__ = ()
    __init__ = object.__init__  # type: ignore[assignment]


def describe(call: CallRecord) -> str:
    """`all_reduce(SUM) [3] float32`, `all_gather_into_tensor out [4] in [2] float32`: the short human form
    of a call. Shapes are labelled `in` / `out` where the call has both (an in-place call's one tensor is
    both, and is not labelled)."""
    text = call.op
    extras = []
    if call.reduce_op:
        extras.append(call.reduce_op)
    if call.root is not None:
        extras.append(f"root={call.root}")
    if extras:
        text += "(" + ", ".join(extras) + ")"
    shapes = call.shapes
    if shapes:
        roles = call.roles if len(call.roles) == len(shapes) and any(call.roles) else ("",) * len(shapes)
        words = []
        for at, (shape, role) in enumerate(zip(shapes[:4], roles, strict=False)):
            if role and (at == 0 or roles[at - 1] != role):
                words.append(role)
            words.append("[" + ", ".join(str(d) for d in shape) + "]")
        text += " " + " ".join(words)
        if len(shapes) > 4:
            text += f" +{len(shapes) - 4}"
    dtypes = sorted(set(call.dtypes))
    if dtypes:
        text += " " + ",".join(dtypes)
    return text


def metric_name(call: CallRecord) -> str | None:
    return call.metric.name if call.metric is not None else None


def differences(a: CallRecord, b: CallRecord) -> list[str]:
    """The compared fields in which two fingerprints of the same (group, seq) disagree; just `op` when
    the ops differ (a different op explains every other difference). Two Lightning metric syncs at the
    same position must sync the same metric: gloo pairs `val_rank0_only` on one rank with `train_loss` on
    the other without a word when their shapes agree, and averages one into the other. (Compared only
    where both ranks name a metric.)"""
    out = [name for name in COMPARED if getattr(a, name) != getattr(b, name)]
    if "op" in out:
        return ["op"]
    mine, theirs = metric_name(a), metric_name(b)
    if mine is not None and theirs is not None and mine != theirs:
        out.append("metric")
    return out


def seqs_by_group(calls: Any) -> dict[str, list[int]]:
    """{group: [sequence numbers]} of (group, seq) pairs, point-to-point calls (seq -1) left out: the
    `python_seqs` a record carries."""
    out: dict[str, list[int]] = {}
    for group, seq in calls:
        if isinstance(seq, int) and seq >= 0:
            out.setdefault(str(group), []).append(seq)
    return out
