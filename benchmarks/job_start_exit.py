"""What the guard costs a job outside its training loop: a trivial 2-rank gloo job (init, one all_reduce,
destroy) under torchrun, plain and under `ddpdoctor run`, in alternating fresh processes; and the parts
of the difference (the launcher alone around `python -c pass`, the guard's bootstrap in a Python that never
imports torch).

    .venv/bin/python benchmarks/job_start_exit.py [--rounds 7] [--versus OTHER_CHECKOUT/src]

Prints the median wall time of each, and the guarded job's cost over the plain one (the target: 0.3 s);
and the CPU seconds of each (all processes of the command together), which a busy machine inflates less
than wall time: on a shared machine read the CPU column, on an idle one the wall column.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BOOTSTRAP = str(Path(__file__).resolve().parents[1] / "src" / "ddpdoctor" / "guard" / "bootstrap")
TRIVIAL = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the command's processes (those it waited for: all of a job's)."""
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300,
                          check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return took, children_cpu() - cpu


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--versus", metavar="SRC",
                        help="also the guarded job under the ddpdoctor whose package is in SRC (another "
                        "checkout's src/), in the same alternation: a before/after on the same load")
    args = parser.parse_args()
    python = sys.executable
    # compiled modules kept, as an installed package has them (the first round writes them)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(TRIVIAL)

        def job() -> list[str]:
            return [python, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                    f"--master-port={free_port()}", str(script)]

        guarded_env = {**env, "DDPDOCTOR_GUARD": "1", "PYTHONPATH": BOOTSTRAP}
        cases = {
            "job plain": lambda: timed(job(), env),
            "job guarded": lambda: timed([python, "-m", "ddpdoctor", "run", "--", *job()], env),
            "python -c pass": lambda: timed([python, "-c", "pass"], env),
            "ddpdoctor run -- python -c pass": lambda: timed(
                [python, "-m", "ddpdoctor", "run", "--", python, "-c", "pass"], env),
            "python -c pass, guard bootstrap": lambda: timed([python, "-c", "pass"], guarded_env),
        }
        if args.versus:
            versus_env = {**env, "PYTHONPATH": os.path.abspath(args.versus)}
            cases["job guarded by --versus"] = lambda: timed([python, "-m", "ddpdoctor", "run", "--", *job()],
                                                             versus_env)
            cases["--versus: ddpdoctor run -- python -c pass"] = lambda: timed(
                [python, "-m", "ddpdoctor", "run", "--", python, "-c", "pass"], versus_env)
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpus: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, run in cases.items():  # alternating: load drifts alike over every case
                wall, cpu = run()
                times[name].append(wall)
                cpus[name].append(cpu)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.rounds} rounds, load average {load:.1f}, {os.cpu_count()} CPUs")
    for name, values in times.items():
        print(f"  {name:34s} median {statistics.median(values):6.2f} s  (min {min(values):.2f}, "
              f"max {max(values):.2f})  CPU {statistics.median(cpus[name]):6.2f} s")
    for label, series in (("wall", times), ("CPU", cpus)):
        for guarded_name in ("job guarded", "job guarded by --versus"):
            if guarded_name not in series:
                continue
            guarded, plain = series[guarded_name], series["job plain"]
            cost = statistics.median(guarded) - statistics.median(plain)
            paired = statistics.median(g - p for g, p in zip(guarded, plain, strict=True))
            print(f"{guarded_name} over plain, {label}: {cost:+.2f} s (median of the paired differences "
                  f"{paired:+.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
