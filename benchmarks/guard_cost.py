"""What the guard costs a CPU job, plain vs guarded in alternating fresh processes (one command, three
numbers): the time one-rank gloo `all_reduce` of one float takes with and without the guard (no peer to
wait for: the difference is the guard's cost per call), the CPU the guard's threads take while the job
idles, and a 2-rank gloo DDP training step.

    .venv/bin/python benchmarks/guard_cost.py [--rounds 6]

Every measurement is a fresh process (`ddpdoctor.install()` before torch is imported for the guarded
ones), plain and guarded alternate round after round so both see the same load, and medians are printed
with the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

CALLS = 2000  # per timed block
BLOCKS = 15
IDLE_SECONDS = 4.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def env_for(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "TORCH_DISTRIBUTED"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    return env


def one_rank(guarded: bool) -> None:
    """Per-call time of `all_reduce` of one float (median block), then the process's CPU while idle."""
    if guarded:
        import ddpdoctor

        ddpdoctor.install(hang_after=600)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    x = torch.ones(1)
    for _ in range(CALLS):
        dist.all_reduce(x)
    blocks = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        for _ in range(CALLS):
            dist.all_reduce(x)
        blocks.append((time.perf_counter() - start) / CALLS)
    # The job idles (a long evaluation, a checkpoint): what runs is the guard's threads (and gloo's, the
    # same in both). Process CPU time over the idle interval, all threads.
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(IDLE_SECONDS)
    idle = (time.process_time() - cpu) / (time.monotonic() - wall)
    print(json.dumps({"call": statistics.median(blocks), "idle": idle}), flush=True)
    os._exit(0)  # gloo's teardown is not what is measured


def ddp_rank(rank: int, guarded: bool, steps: int, out: str) -> None:
    if guarded:
        import ddpdoctor

        ddpdoctor.install(hang_after=600)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        metric = loss.detach().clone()
        dist.all_reduce(metric)  # a logged metric

    for _ in range(20):
        step()
    blocks = []
    for _ in range(max(1, steps // 20)):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(20):
            step()
        blocks.append((time.perf_counter() - start) / 20)
    if rank == 0:
        with open(out, "w") as handle:
            json.dump({"step": statistics.median(blocks)}, handle)
    dist.barrier()
    os._exit(0)


def fresh(args: list[str], timeout: float = 300) -> dict[str, float]:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env_for(free_port()),
                          capture_output=True, text=True, timeout=timeout, start_new_session=True)
    if done.returncode != 0:
        raise SystemExit(f"guard_cost.py: a measuring process failed ({' '.join(args)}):\n"
                         f"{done.stderr[-2000:]}")
    return {k: float(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def ddp_job(guarded: bool, steps: int) -> float:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "step.json")
        here = os.path.dirname(os.path.abspath(__file__))
        code = (f"import sys; sys.path.insert(0, {here!r}); import guard_cost as g; "
                "import torch.multiprocessing as mp; "
                f"mp.spawn(g.ddp_rank, args=({guarded!r}, {steps}, {out!r}), nprocs=2)")
        subprocess.run([sys.executable, "-c", code], env=env_for(free_port()), check=True, timeout=300,
                       capture_output=True, start_new_session=True)
        with open(out) as handle:
            return float(json.load(handle)["step"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="plain/guarded pairs of each (default 6)")
    parser.add_argument("--steps", type=int, default=200, help="timed DDP steps per job (default 200)")
    parser.add_argument("--one-rank", choices=("plain", "guarded"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_rank:
        one_rank(args.one_rank == "guarded")
        return 0
    load = os.getloadavg()[0]
    calls: dict[str, list[float]] = {"plain": [], "guarded": []}
    idle: dict[str, list[float]] = {"plain": [], "guarded": []}
    steps: dict[str, list[float]] = {"plain": [], "guarded": []}
    for _ in range(args.rounds):
        for config in ("plain", "guarded"):
            measured = fresh(["--one-rank", config])
            calls[config].append(measured["call"])
            idle[config].append(measured["idle"])
            steps[config].append(ddp_job(config == "guarded", args.steps))
    med = {name: {c: statistics.median(v) for c, v in table.items()}
           for name, table in (("call", calls), ("idle", idle), ("step", steps))}
    added = [g - p for g, p in zip(calls["guarded"], calls["plain"], strict=True)]
    print(f"guard_cost.py: {args.rounds} rounds of fresh processes, plain and guarded alternating; "
          f"load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at the end")
    print(f"1-rank gloo all_reduce of 1 float: plain {med['call']['plain'] * 1e6:.2f} µs, guarded "
          f"{med['call']['guarded'] * 1e6:.2f} µs: {statistics.median(added) * 1e6:+.2f} µs per call "
          f"(median of the rounds' differences; each round {', '.join(f'{a * 1e6:+.1f}' for a in added)})")
    print(f"CPU while the job idles ({IDLE_SECONDS:.0f} s, whole process): plain "
          f"{med['idle']['plain'] * 100:.3f} %, "
          f"guarded {med['idle']['guarded'] * 100:.3f} % of a core: the guard's threads "
          f"{(med['idle']['guarded'] - med['idle']['plain']) * 100:+.3f} %")
    ratio = med["step"]["guarded"] / med["step"]["plain"]
    print(f"2-rank gloo DDP step: plain {med['step']['plain'] * 1e3:.3f} ms, guarded "
          f"{med['step']['guarded'] * 1e3:.3f} ms: {ratio:.4f}x ({(ratio - 1) * 100:+.2f} %; rounds: plain "
          f"{', '.join(f'{s * 1e3:.2f}' for s in steps['plain'])}, guarded "
          f"{', '.join(f'{s * 1e3:.2f}' for s in steps['guarded'])} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
