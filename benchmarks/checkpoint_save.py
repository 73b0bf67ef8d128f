"""What the F10 checkpoint audit costs a save, and that it leaves the file's bytes alone.

    .venv/bin/python benchmarks/checkpoint_save.py [--saves 20] [--megabytes 50]

Runs a 2-rank gloo job under `ddpdoctor run -- torchrun`, so `torch.save` is the guard's patched one, with
the job's real store behind it. Rank 0 saves a state dict of the given size `--saves` times through the
patched `torch.save` and as many times through the original (`torch.save.__wrapped__`), interleaved (the
first of each pair alternates), each to a file of its own kind; rank 1 waits. It prints the median of each,
their ratio, the added milliseconds per save, and whether the two files are byte-identical. They are
written under the same name in two folders (a torch archive's records are named after its file), and
compared record by record too: torch >= 2.5 writes a random `.data/serialization_id` into every archive,
so two plain saves of one state dict differ in those bytes alone, and the comparison says so.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path


def _differing_records(a: Path, b: Path) -> list[str]:
    with zipfile.ZipFile(a) as first, zipfile.ZipFile(b) as second:
        names = sorted(set(first.namelist()) | set(second.namelist()))
        return [name for name in names if name not in first.namelist() or name not in second.namelist()
                or first.read(name) != second.read(name)]


def rank_side(out: Path, saves: int, megabytes: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        patched = torch.save
        original = getattr(patched, "__wrapped__", None)
        if original is None:
            raise SystemExit("torch.save is not patched: run this through ddpdoctor run (see the doc)")
        per_tensor = 1024 * 1024 // 4  # 1 MiB of float32
        state = {f"layer{i}.weight": torch.randn(per_tensor) for i in range(megabytes)}
        times: dict[str, list[float]] = {"audited": [], "plain": []}
        for kind in times:
            (out / kind).mkdir()
        saves_by = {"audited": patched, "plain": original}
        for index in range(saves):
            order = ["audited", "plain"] if index % 2 == 0 else ["plain", "audited"]
            for kind in order:
                started = time.perf_counter()
                saves_by[kind](state, str(out / kind / "ckpt.pt"))
                times[kind].append(time.perf_counter() - started)
        audited, plain = statistics.median(times["audited"]), statistics.median(times["plain"])
        audited_file, plain_file = out / "audited" / "ckpt.pt", out / "plain" / "ckpt.pt"
        same = audited_file.read_bytes() == plain_file.read_bytes()
        differing = _differing_records(audited_file, plain_file)
        print(f"{saves} saves of {megabytes} MiB each way, interleaved")
        print(f"median torch.save: audited {audited * 1000:.1f} ms, plain {plain * 1000:.1f} ms, "
              f"ratio {audited / plain:.3f}, added {1000 * (audited - plain):+.2f} ms per save")
        print(f"files byte-identical: {same}; records that differ: {differing or 'none'}", flush=True)
        # The audit's fixed cost alone, where the disk does not drown it: a tiny state dict, many times.
        tiny = {"w": torch.ones(16)}
        small: dict[str, list[float]] = {"audited": [], "plain": []}
        for index in range(200):
            order = ["audited", "plain"] if index % 2 == 0 else ["plain", "audited"]
            for kind in order:
                started = time.perf_counter()
                saves_by[kind](tiny, str(out / kind / "tiny.pt"))
                small[kind].append(time.perf_counter() - started)
        added = statistics.median(small["audited"]) - statistics.median(small["plain"])
        print(
            f"the audit alone (200 interleaved saves of 64 bytes): {added * 1000:+.3f} ms per save",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--megabytes", type=int, default=50)
    parser.add_argument("--rank-side", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_side:
        rank_side(Path(args.rank_side), args.saves, args.megabytes)
        return 0
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-save-bench-") as out:
        command = [
            sys.executable,
            "-m",
            "ddpdoctor",
            "run",
            "--",
            str(bin_dir / "torchrun"),
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            os.path.abspath(__file__),
            "--rank-side",
            out,
            "--saves",
            str(args.saves),
            "--megabytes",
            str(args.megabytes),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        return subprocess.run(command, env=env, timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main())
