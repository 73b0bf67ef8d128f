"""The guard's keys in the job's rendezvous store, over a client connection of its own (no new server, no
new port), so the training thread never waits behind the monitor's traffic. See protocol.StoreKeys."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

from ...failsafe import attempt, failsafe
from ...records import RankRecord, RankState
from ..protocol import Control, ControlValue, StoreKeys


def own_client(where: str, timeout_s: float | None) -> Any:
    """A client of the default group's store of its own: a clone, so that the training thread never waits
    behind this one's traffic (the monitor's, an audit's). `where` names the user in a debug line."""
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    base: Any = getattr(store, "_underlying_non_prefix_store", None) or store
    # stores without clone (FileStore, HashStore) are thread safe enough
    client = attempt(f"{where}: cloning the store", base.clone, base)
    if timeout_s is not None:
        with failsafe(f"{where}: store timeout"):
            client.set_timeout(datetime.timedelta(seconds=timeout_s))
    return client


class StoreLink:
    """The guard's keys in the rendezvous store, over its own client connection."""

    def __init__(self, timeout: float, keys: StoreKeys) -> None:
        self.store = own_client("monitor.StoreLink", timeout)
        self.keys = keys

    def init(self) -> None:
        self.store.compare_set(self.keys.control, "", Control.IDLE.value)

    def publish(self, rank: int, record: RankRecord) -> None:
        self.store.set(self.keys.rank(rank), json.dumps(record.to_json(), separators=(",", ":"), default=str))

    def read_control(self) -> ControlValue:
        return ControlValue.parse(self.store.get(self.keys.control).decode())

    def move_control(self, expected: Control, new: Control) -> ControlValue:
        """compare_set of the control key; what it holds afterwards."""
        return ControlValue.parse(
            self.store.compare_set(self.keys.control, expected.value, new.value).decode()
        )

    def claim_verdict(self, rank: int) -> ControlValue:
        """Make the control key `verdict:<rank>` unless it holds another rank's verdict; what it holds then.
        It may move between idle and suspect under us: claimed against what it holds now, a few times."""
        mine = ControlValue.verdict_of(rank)
        held = self.store.get(self.keys.control).decode()
        for _ in range(20):
            if ControlValue.parse(held).state is Control.VERDICT:
                break
            held = self.store.compare_set(self.keys.control, held, mine).decode()
        return ControlValue.parse(held)

    def read(self, rank: int) -> RankRecord | None:
        try:
            return RankRecord.from_json(json.loads(self.store.get(self.keys.rank(rank))))
        except (ValueError, AttributeError):
            return None

    def read_all(self, world_size: int) -> dict[int, RankRecord]:
        keys = [self.keys.rank(r) for r in range(world_size)]
        present = keys if self.store.check(keys) else [k for k in keys if self.store.check([k])]
        out: dict[int, RankRecord] = {}
        if not present:
            return out
        for key, value in zip(present, self.store.multi_get(present), strict=True):
            try:
                out[int(key.rsplit("/", 1)[1])] = RankRecord.from_json(json.loads(value))
            except (ValueError, AttributeError):
                continue
        return out

    def leave(self, rank: int, world_size: int, heartbeat: float) -> None:
        """This process hosts the store (rank 0 under mp.spawn or Lightning's launcher) and is leaving
        while peers still run, as a clean job that skips destroy_process_group does: their monitors'
        next store call would fail, and torch prints a C++ stack trace for it. Tell them through the
        control key and wait (two heartbeats at most) until they have let go of the store."""
        records = self.read_all(world_size)
        running = [r for r in range(world_size)
                   if r != rank and (r not in records or records[r].state is not RankState.EXITED)]
        if not running or self.move_control(Control.IDLE, Control.LEAVING).state is not Control.LEAVING:
            return  # nobody left to tell, or a rank waits or reported: its verdict needs no help from here
        deadline = time.monotonic() + 2 * heartbeat + 1.0
        while time.monotonic() < deadline and self.store.add(self.keys.let_go, 0) < len(running):
            time.sleep(0.05)
