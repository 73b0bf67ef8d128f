"""What the guard's loader audits (F7, F2, DDP502: `ddpdoctor.audits.loader_hooks`) cost, side by side in
one run: `iter(loader)` alone, and an epoch of 2-rank DDP training (gloo, CPU) over a shuffling
DistributedSampler, with the audits installed and removed in alternating blocks of the same processes
(the best block of each is kept: the machine's load changes over time).

    .venv/bin/python benchmarks/loader_audit_overhead.py [--quick]

The audits run once per `iter()` of a loader (once per epoch), never per batch, so an epoch's cost is the
first number once, whatever the epoch's length.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _loader(dataset: Any, rank: int, world: int, batch: int) -> Any:
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    return DataLoader(dataset, batch_size=batch, sampler=sampler)


def iter_cost(blocks: int, calls: int) -> dict[str, float]:
    """Seconds per `iter(loader)` (the iterator made, no batch drawn), audits off and on."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import TensorDataset

    from ddpdoctor.audits.loader_hooks import install_loader_audits

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    dataset = TensorDataset(torch.randn(4096, 16))
    found: list[Any] = []
    best = {"off": float("inf"), "on": float("inf")}
    for block in range(blocks):
        for mode in ("off", "on") if block % 2 else ("on", "off"):  # neither always goes first
            uninstall = install_loader_audits(found.append) if mode == "on" else None
            loader = _loader(dataset, 0, 1, 32)
            epoch = 0
            start = time.perf_counter()
            for _ in range(calls):
                loader.sampler.set_epoch(epoch)
                epoch += 1
                iter(loader)
            best[mode] = min(best[mode], (time.perf_counter() - start) / calls)
            if uninstall is not None:
                uninstall()
    dist.destroy_process_group()
    assert not found, found  # the epoch moves: nothing to report
    return best


def ddp_worker(rank: int, world: int, port: int, blocks: int, epochs: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import TensorDataset

    from ddpdoctor.audits.loader_hooks import install_loader_audits

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                                        torch.nn.Linear(256, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = TensorDataset(torch.randn(1024, 64), torch.randn(1024, 1))
    # wall time, and the CPU time of the training thread (free of the scheduling noise of 2 busy cores)
    per_epoch: dict[str, list[float]] = {"off": [], "on": [], "off_cpu": [], "on_cpu": []}
    found: list[Any] = []
    for block in range(blocks):
        for mode in ("off", "on") if block % 2 else ("on", "off"):
            uninstall = install_loader_audits(found.append) if mode == "on" else None
            loader = _loader(dataset, rank, world, 32)  # 16 steps an epoch per rank
            dist.barrier()
            start, cpu = time.perf_counter(), time.thread_time()
            for epoch in range(epochs):
                loader.sampler.set_epoch(epoch)
                for x, y in loader:
                    optimizer.zero_grad()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    optimizer.step()
            per_epoch[mode].append((time.perf_counter() - start) / epochs)
            per_epoch[mode + "_cpu"].append((time.thread_time() - cpu) / epochs)
            if uninstall is not None:
                uninstall()
    if rank == 0:
        steps = len(loader)
        with open(out, "w") as handle:
            json.dump({mode: {"epoch": min(v), "median_epoch": statistics.median(v), "steps": steps}
                       for mode, v in per_epoch.items()}, handle)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer blocks (a smoke run)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import loader_audit_overhead as me
    import torch.multiprocessing as mp

    iters = me.iter_cost(blocks=5 if args.quick else 20, calls=200)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.json")
        mp.spawn(me.ddp_worker, args=(2, free_port(), 3 if args.quick else 10, 3, out), nprocs=2)
        with open(out) as handle:
            ddp = json.load(handle)
    off, on = iters["off"], iters["on"]
    print(f"iter(loader) over a DistributedSampler: {off * 1e6:.1f} µs without the audits, {on * 1e6:.1f} µs "
          f"with them: {(on - off) * 1e6:+.1f} µs per epoch of each loader")
    steps = ddp["off"]["steps"]
    for what, suffix in (("wall", ""), ("CPU time of the training thread", "_cpu")):
        for label, key in (("best", "epoch"), ("median", "median_epoch")):
            e_off, e_on = ddp["off" + suffix][key], ddp["on" + suffix][key]
            print(f"2-rank DDP epoch ({steps} steps, gloo, CPU), {what}, {label} block: {e_off * 1e3:.2f} ms "
                  f"without, {e_on * 1e3:.2f} ms with the audits: {e_on / e_off:.3f}x "
                  f"({(e_on - e_off) / steps * 1e6:+.1f} µs per step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
