"""CPU time of `ddpdoctor explain` on one synthetic 8-rank log: this tree against another, alternated.

    git archive BASE src | tar -x -C /tmp/base        # the tree to compare against, outside the repository
    .venv/bin/python benchmarks/explain_cpu_ab.py /tmp/base/src [--size 100M] [--runs 4]

On a shared machine wall time swings with the other jobs; CPU time (user + system of the explain process)
much less. The log is the one `explain_throughput.py` writes (interleaved ranks, an NCCL watchdog timeout at
the end), written once to a temporary file and deleted afterwards; both trees explain it in a fresh process
each run, alternating, and the medians are compared.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from explain_throughput import parse_size, write_log  # noqa: E402

HERE_SRC = str(Path(__file__).resolve().parent.parent / "src")


def cpu_seconds(src: str, log: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "ddpdoctor", "explain", str(log), "--format", "json"],
                   env={**os.environ, "PYTHONPATH": src}, stdout=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base_src", help="the other tree's src/ folder")
    parser.add_argument("--size", default="100M")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-ab-") as tmp:
        log = Path(tmp) / "job.log"
        write_log(log, parse_size(args.size))
        size = log.stat().st_size
        times: dict[str, list[float]] = {"base": [], "this": []}
        for run in range(args.runs):
            for name, src in (("base", args.base_src), ("this", HERE_SRC)):
                times[name].append(cpu_seconds(src, log))
                print(f"{name} {run}: {times[name][-1]:.2f} s CPU", flush=True)
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name}: median {median:.2f} s CPU = {size / median / 1e6:.1f} MB per CPU-second")
    ratio = statistics.median(times["this"]) / statistics.median(times["base"])
    print(f"this/base CPU time: {ratio:.3f} (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
