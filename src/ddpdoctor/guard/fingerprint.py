"""The fingerprint of one collective call: what every rank of a group must agree on, plus where it came from."""

from __future__ import annotations

import json
from typing import Any

from .callsite import Frame
from .lightning_metrics import MetricOrigin

# Compared across ranks; devices and call sites are not (cuda:0 vs cuda:1 and different lines are legitimate).
COMPARED = ("op", "reduce_op", "root", "shapes", "dtypes")

# Point-to-point ops pair with one peer, not with the whole group at the same sequence number.
P2P_OPS = frozenset(
    {"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"}
)


class CollectiveFingerprint:
    """One collective as this rank issued it. Built on the hot path, so: slots, no validation."""

    __slots__ = (
        "index",
        "group",
        "seq",
        "op",
        "reduce_op",
        "root",
        "shapes",
        "dtypes",
        "devices",
        "site",
        "library",
        "time",
        "state",
        "metric",
    )

    def __init__(
        self,
        index: int,
        group: str,
        seq: int,
        op: str,
        reduce_op: str | None,
        root: int | None,
        shapes: list,
        dtypes: list,
        devices: list,
        site: Frame | None,
        library: Frame | None,
        time: float,
    ) -> None:
        self.index = index
        self.group = group
        self.seq = seq
        self.op = op
        self.reduce_op = reduce_op
        self.root = root
        self.shapes = shapes
        self.dtypes = dtypes
        self.devices = devices
        self.site = site
        self.library = library
        self.time = time
        self.state = "in"  # in | done | failed
        # Lightning syncs a logged metric long after `self.log` returned: which metric, and where it was
        # logged, set for collectives Lightning issues while syncing one.
        self.metric: MetricOrigin | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "index": self.index,
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "reduce_op": self.reduce_op,
            "root": self.root,
            "shapes": self.shapes,
            "dtypes": self.dtypes,
            "devices": self.devices,
            "site": self.site.to_list() if self.site else None,
            "library": self.library.to_list() if self.library else None,
            "time": round(self.time, 6),
            "state": self.state,
        }
        if self.metric is not None:
            out["metric"] = self.metric.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


def describe(fp: dict[str, Any]) -> str:
    """`all_reduce(SUM) [3] float32` — the short human form of a recorded fingerprint dict."""
    text = str(fp.get("op"))
    extras = []
    if fp.get("reduce_op"):
        extras.append(str(fp["reduce_op"]))
    if fp.get("root") is not None:
        extras.append(f"root={fp['root']}")
    if extras:
        text += "(" + ", ".join(extras) + ")"
    shapes = fp.get("shapes") or []
    if shapes:
        text += " " + " ".join("[" + ", ".join(str(d) for d in s) + "]" for s in shapes[:4])
        if len(shapes) > 4:
            text += f" +{len(shapes) - 4}"
    dtypes = sorted(set(fp.get("dtypes") or []))
    if dtypes:
        text += " " + ",".join(dtypes)
    return text


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The compared fields in which two fingerprints of the same (group, seq) disagree."""
    return [name for name in COMPARED if a.get(name) != b.get(name)]


def site_of(fp: dict[str, Any]) -> tuple[str, int] | None:
    site = fp.get("site") or fp.get("library")
    if site:
        return str(site[0]), int(site[1])
    return None
