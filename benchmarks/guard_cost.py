"""What the guard costs a CPU job, plain vs guarded in alternating fresh processes (one command, three
numbers): the time one-rank gloo `all_reduce` of one float takes with and without the guard (no peer to
wait for: the difference is the guard's cost per call), the CPU the guard's threads take while the job
idles, and a 2-rank gloo DDP training step.

    .venv/bin/python benchmarks/guard_cost.py [--rounds 6] [--baseline DIR] [--no-step]

`--baseline DIR` adds a third configuration, guarded by another version of ddpdoctor (DIR holds its
`ddpdoctor` package, e.g. `git archive <commit> src | tar -x -C /tmp/base` and DIR=/tmp/base/src), in
the same rounds: before and after in one run.

Every measurement is a fresh process (`ddpdoctor.install()` before torch is imported for the guarded
ones), plain and guarded alternate round after round so both see the same load; each process keeps its
least disturbed block (other tenants' work only ever adds time), and the median over rounds is printed
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


def env_for(port: int, source: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "TORCH_DISTRIBUTED"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    if source:  # another ddpdoctor, imported first
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
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
    ticks = time_monitor_ticks() if guarded else []
    x = torch.ones(1)
    for _ in range(CALLS):
        dist.all_reduce(x)
    blocks, cpu_blocks = [], []
    for _ in range(BLOCKS):
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(CALLS):
            dist.all_reduce(x)
        cpu_blocks.append((time.thread_time() - start_cpu) / CALLS)
        blocks.append((time.perf_counter() - start) / CALLS)
    # The job idles (a long evaluation, a checkpoint): what runs is the guard's threads (and gloo's, the
    # same in both). Process CPU time over the idle interval, all threads.
    cpu, wall = time.process_time(), time.monotonic()
    idle_from = wall
    time.sleep(IDLE_SECONDS)
    idle = (time.process_time() - cpu) / (time.monotonic() - wall)
    # the least disturbed block: on a shared machine other tenants' work only ever adds time
    measured = {"call": min(blocks), "call_cpu": min(cpu_blocks), "idle": idle}
    idle_ticks = [spent for at, spent in ticks if at >= idle_from]
    busy_ticks = [spent for at, spent in ticks if at < idle_from]
    if idle_ticks and busy_ticks:
        # a heartbeat's CPU on the monitor's thread, an upper bound of the time it holds the GIL (its store
        # round trips wait in C with the GIL released): while the job idles, and while it issues the timed
        # collectives back to back (each folded into the chain at the next heartbeat)
        measured.update(tick_idle=statistics.median(idle_ticks), tick_busy=statistics.median(busy_ticks))
    print(json.dumps(measured), flush=True)
    os._exit(0)  # gloo's teardown is not what is measured


def time_monitor_ticks() -> list[tuple[float, float]]:
    """The monitor's heartbeats from now on, each as (monotonic time it began, CPU time its thread spent in
    it), appended to the list returned."""
    from ddpdoctor.guard import current_runtime

    monitor = current_runtime().monitor
    tick = monitor.tick
    spent: list[tuple[float, float]] = []

    def timed() -> None:
        at, start = time.monotonic(), time.thread_time()
        try:
            tick()
        finally:
            spent.append((at, time.thread_time() - start))

    monitor.tick = timed  # the loop calls self.tick(): the instance's attribute wins
    return spent


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
            json.dump({"step": min(blocks)}, handle)  # the least disturbed block
    dist.barrier()
    os._exit(0)


def fresh(args: list[str], source: str | None = None, timeout: float = 300) -> dict[str, float]:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *args],
                          env=env_for(free_port(), source), capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)
    if done.returncode != 0:
        raise SystemExit(f"guard_cost.py: a measuring process failed ({' '.join(args)}):\n"
                         f"{done.stderr[-2000:]}")
    return {k: float(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def ddp_job(guarded: bool, steps: int, source: str | None = None) -> float:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "step.json")
        here = os.path.dirname(os.path.abspath(__file__))
        code = (f"import sys; sys.path.insert(0, {here!r}); import guard_cost as g; "
                "import torch.multiprocessing as mp; "
                f"mp.spawn(g.ddp_rank, args=({guarded!r}, {steps}, {out!r}), nprocs=2)")
        subprocess.run([sys.executable, "-c", code], env=env_for(free_port(), source), check=True,
                       timeout=300, capture_output=True, start_new_session=True)
        with open(out) as handle:
            return float(json.load(handle)["step"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="plain/guarded pairs of each (default 6)")
    parser.add_argument("--steps", type=int, default=200, help="timed DDP steps per job (default 200)")
    parser.add_argument("--baseline", metavar="DIR", help="also measure the ddpdoctor package under DIR")
    parser.add_argument("--no-step", action="store_true",
                        help="skip the 2-rank DDP step (per-call and idle figures only)")
    parser.add_argument("--one-rank", choices=("plain", "guarded"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_rank:
        one_rank(args.one_rank == "guarded")
        return 0
    load = os.getloadavg()[0]
    configs = ["plain", "guarded"] + (["baseline"] if args.baseline else [])
    source = {"baseline": os.path.abspath(args.baseline) if args.baseline else None}
    calls: dict[str, list[float]] = {c: [] for c in configs}
    calls_cpu: dict[str, list[float]] = {c: [] for c in configs}
    idle: dict[str, list[float]] = {c: [] for c in configs}
    ticks: dict[str, list[tuple[float, float]]] = {c: [] for c in configs}
    steps: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for config in configs:
            guarded = config != "plain"
            measured = fresh(["--one-rank", "guarded" if guarded else "plain"], source.get(config))
            calls[config].append(measured["call"])
            calls_cpu[config].append(measured["call_cpu"])
            idle[config].append(measured["idle"])
            if "tick_idle" in measured:
                ticks[config].append((measured["tick_idle"], measured["tick_busy"]))
            if not args.no_step:
                steps[config].append(ddp_job(guarded, args.steps, source.get(config)))
    print(f"guard_cost.py: {args.rounds} rounds of fresh processes, {', '.join(configs)} alternating; "
          f"load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at the end")
    for config in configs[1:]:
        name = "guarded" if config == "guarded" else f"guarded by {args.baseline}"
        added = [g - p for g, p in zip(calls[config], calls["plain"], strict=True)]
        print(f"{name}: 1-rank gloo all_reduce of 1 float: plain "
              f"{statistics.median(calls['plain']) * 1e6:.2f} µs, guarded "
              f"{statistics.median(calls[config]) * 1e6:.2f} µs: "
              f"{statistics.median(added) * 1e6:+.2f} µs per call (median of the rounds' differences; each "
              f"round {', '.join(f'{a * 1e6:+.1f}' for a in added)})")
        added_cpu = [g - p for g, p in zip(calls_cpu[config], calls_cpu["plain"], strict=True)]
        print(f"{name}: the same, CPU time of the calling thread (free of time spent descheduled): plain "
              f"{statistics.median(calls_cpu['plain']) * 1e6:.2f} µs, guarded "
              f"{statistics.median(calls_cpu[config]) * 1e6:.2f} µs: "
              f"{statistics.median(added_cpu) * 1e6:+.2f} µs")
        plain_idle, guard_idle = statistics.median(idle["plain"]), statistics.median(idle[config])
        print(f"{name}: CPU while the job idles ({IDLE_SECONDS:.0f} s, whole process): plain "
              f"{plain_idle * 100:.3f} %, guarded {guard_idle * 100:.3f} % of a core: the guard's threads "
              f"{(guard_idle - plain_idle) * 100:+.3f} %")
        if ticks[config]:
            print(f"{name}: the monitor's heartbeat, CPU time of its thread (at most the GIL it holds): "
                  f"{statistics.median(t for t, _ in ticks[config]) * 1e6:.0f} µs while the job idles, "
                  f"{statistics.median(b for _, b in ticks[config]) * 1e6:.0f} µs while it issues the timed "
                  "collectives (medians)")
        if args.no_step:
            continue
        plain_step, guard_step = statistics.median(steps["plain"]), statistics.median(steps[config])
        ratio = guard_step / plain_step
        print(f"{name}: 2-rank gloo DDP step: plain {plain_step * 1e3:.3f} ms, guarded "
              f"{guard_step * 1e3:.3f} ms: {ratio:.4f}x ({(ratio - 1) * 100:+.2f} %; rounds: plain "
              f"{', '.join(f'{s * 1e3:.2f}' for s in steps['plain'])}, guarded "
              f"{', '.join(f'{s * 1e3:.2f}' for s in steps[config])} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
