"""Throughput and peak memory of `ddpdoctor explain` on a synthetic multi-rank log.

    python benchmarks/explain_throughput.py               # 1 GB log, plus a 100 MB one to compare memory
    python benchmarks/explain_throughput.py --size 50M    # quick run

The log imitates an 8-rank torchrun job: interleaved `[rankN]:` lines (progress, metrics, NCCL INFO, c10d
warnings, an unrelated caught exception now and then), ending in an NCCL watchdog timeout on seven ranks and
torchrun's summary. It is written to a temporary file and deleted afterwards. Each size is explained in a
fresh process, so its peak resident memory (ru_maxrss) is its own; the target is >= 20 MB/s with memory
that does not grow with the log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_MB_S = 20.0
FAILURE = """\
[rank{r}]:[E1122 10:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank {r}] \
Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=90210, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) \
ran for 600020 milliseconds before timing out.
[rank{r}]:[E1122 10:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank {r}] \
Exception (either an error or timeout) \
detected by watchdog at work: 90210, last enqueued NCCL work: 90211, last completed NCCL work: 90209.
"""
SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_10:24:46
  host      : gpu-node-07
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 4119)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4119
============================================================
"""


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def chunk(rng: random.Random, step: int) -> str:
    """About 1 MB of ordinary multi-rank training output."""
    lines = []
    size = 0
    while size < (1 << 20):
        r = rng.randrange(8)
        kind = rng.random()
        if kind < 0.55:
            line = (
                f"[rank{r}]:Epoch {step // 1000}:  {step % 100:>2}%|#####     | {step}/500000 "
                f"[1:{step % 60:02d}:11<3:01:09, 2.{r}1it/s, loss={rng.random():.4f}, v_num=7]"
            )
        elif kind < 0.75:
            line = (
                f"[rank{r}]:{{'loss': {rng.random():.4f}, 'grad_norm': {rng.random() * 3:.3f}, "
                f"'learning_rate': 2e-05, 'epoch': {step / 1e4:.2f}}}"
            )
        elif kind < 0.9:
            line = (
                f"[rank{r}]:gpu-node-07:41{r}9:42{r}0 [{r}] NCCL INFO Channel {step % 32:02d}/0 : {r} -> "
                f"{(r + 1) % 8} [send] via NET/IB/0/GDRDMA comm 0x55{step:08x} nRanks 8"
            )
        elif kind < 0.98:
            line = (
                f"[rank{r}]:[W1122 09:{step % 60:02d}:0{r}.1{step % 1000:03d} reducer.cpp:1400] Warning: "
                "find_unused_parameters=True was specified in DDP constructor, but did not find any unused "
                "parameters in the forward pass."
            )
        else:
            line = (
                f'[rank{r}]:Traceback (most recent call last):\n[rank{r}]:  File "/data/loader.py", line 88, '
                'in load\n'
                f"[rank{r}]:KeyError: 'sample_{step}' (skipped)"
            )
        lines.append(line)
        size += len(line) + 1
        step += 1
    return "\n".join(lines) + "\n"


def write_log(path: Path, size: int) -> None:
    rng = random.Random(0)
    pieces = [chunk(rng, i * 10_000) for i in range(8)]  # repeated: generation must not dominate
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        i = 0
        while written < size:
            piece = pieces[i % len(pieces)]
            out.write(piece)
            written += len(piece.encode("utf-8"))
            i += 1
        for r in (0, 2, 3, 4, 5, 6, 7):  # rank 1 is the silent culprit
            out.write(FAILURE.format(r=r))
        out.write(SUMMARY)


def measure(path: str) -> None:
    """Child process: explain the log, print one JSON line with the numbers."""
    from ddpdoctor.explain import explain_paths

    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    explanation = explain_paths([path])
    elapsed = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    best = explanation.diagnoses[0].finding if explanation.diagnoses else None
    print(
        json.dumps(
            {
                "bytes": os.path.getsize(path),
                "seconds": elapsed,
                "lines": explanation.stats.lines,
                "peak_rss_mb": peak_kb / 1024,
                "rss_before_mb": baseline_kb / 1024,
                "diagnosis": best.class_ if best else None,
                "silent_ranks": best.facts.get("silent_ranks") if best else None,
            }
        )
    )


def run(size: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-bench-") as tmp:
        path = Path(tmp) / "job.log"
        started = time.perf_counter()
        write_log(path, size)
        print(
            f"  wrote {path.stat().st_size / 1e6:,.0f} MB in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        child = subprocess.run(
            [sys.executable, __file__, "--measure", str(path)],
            capture_output=True,
            text=True,
            timeout=3600,
            check=True,
        )
        return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="1G", help="log size, e.g. 50M, 1G (default 1G)")
    parser.add_argument("--no-compare", action="store_true", help="skip the run at a tenth of the size")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return 0
    size = parse_size(args.size)
    sizes = [size] if args.no_compare else [max(size // 10, 1 << 20), size]
    results = []
    for each in sizes:
        print(f"explaining a {each / 1e6:,.0f} MB synthetic 8-rank log ...", file=sys.stderr)
        result = run(each)
        result["mb_per_s"] = result["bytes"] / 1e6 / result["seconds"]
        results.append(result)
        print(
            f"  {result['bytes'] / 1e6:>8,.0f} MB  {result['lines']:>12,} lines  {result['seconds']:7.1f} s  "
            f"{result['mb_per_s']:6.1f} MB/s  peak RSS {result['peak_rss_mb']:6.1f} MB "
            f"(after imports {result['rss_before_mb']:.1f} MB)  -> {result['diagnosis']}, silent ranks "
            f"{result['silent_ranks']}"
        )
    ok = all(r["mb_per_s"] >= TARGET_MB_S and r["diagnosis"] == "collective-timeout" for r in results)
    if len(results) == 2:
        growth = results[1]["peak_rss_mb"] - results[0]["peak_rss_mb"]
        print(
            f"peak memory growth from {results[0]['bytes'] / 1e6:,.0f} MB to "
            f"{results[1]['bytes'] / 1e6:,.0f} MB: {growth:+.1f} MB"
        )
        ok = ok and growth < 32
    print("target (>= 20 MB/s, memory independent of size):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
