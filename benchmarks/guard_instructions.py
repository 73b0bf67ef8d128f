"""Instructions the guard executes per collective call, counted by callgrind: a load-independent figure
where the machine is shared and the per-call microseconds move with the other tenants' work.

    .venv/bin/python benchmarks/guard_instructions.py [--source DIR] [--plain] [--gc] [--real]

A real one-rank gloo process, guarded (`ddpdoctor.install()`), calls a guarded `all_reduce` of one float
from one line: the wrapper made by `make_wrapper` over a Python no-op in place of torch's function, so
that gloo's own work is not counted. The calls run inside `itertools.starmap` and callgrind counts only
there (`--toggle-collect=starmap_next`); instrumentation starts after torch is imported (a callgrind
client request, from a few lines of C compiled here, when gcc and valgrind's headers are found). Two
processes, 1,000 and 3,000 calls after the same 200 warm-up calls: the difference over 2,000 is the
count per call, start-up and warm-up cancelled. `--plain` counts the no-op alone (the loop's own share),
`--source DIR` another ddpdoctor (e.g. `git archive <commit> src | tar -x -C /tmp/base`, DIR=/tmp/base/src),
`--gc` leaves Python's cyclic collector on: off by default, since whether one of its older-generation
passes (over much of the heap of a process with torch) falls in the 2,000 counted calls moves the count
by a thousand or more per call (main at a284b2a: 21,778 and 22,943 in two runs with it on, 21,240 and
21,327 with it off). `--real` calls torch's own `all_reduce` (through the guard's wrapper when guarded):
the collective's whole price, gloo's work included, so that guarded minus `--plain --real` is what the
guard adds to a real call, torch's Python around the collective included (the wrapper skips torch's
logging decorator on its fast path).

Needs valgrind; a run takes a few minutes (torch's import under valgrind).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

WARM, FEW, MANY = 200, 1000, 3000
CLIENT = """#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_START_INSTRUMENTATION; }
"""


def measured(mode: str, calls: int, library: str | None, gc_on: bool, real: bool) -> None:
    """The measured process (run under valgrind)."""
    import collections
    import ctypes
    import gc
    import itertools

    if mode == "guarded":
        import ddpdoctor

        ddpdoctor.install(hang_after=600)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)

    def noop(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        return None

    func: Callable[..., Any] = noop
    if real:
        func = dist.all_reduce
    elif mode == "guarded":
        from ddpdoctor.guard.rank.intercept import OpSpec, original
        from ddpdoctor.guard.rank.wrapper_importlib_bootstrap import make_wrapper

        func = make_wrapper(OpSpec("all_reduce", original("all_reduce")), noop)
    x = torch.ones(1)

    def run(count: int) -> None:
        collections.deque(itertools.starmap(func, [(x,)] * count), maxlen=0)  # the one calling line

    if not gc_on:
        gc.collect()
        gc.disable()
    if library:
        ctypes.CDLL(library).start()
    run(WARM)
    run(calls)
    if mode == "guarded":
        from ddpdoctor.guard import current_runtime

        runtime = current_runtime()
        # disabled (a store timeout under valgrind, say): what was counted is the bypass, not the guard
        if runtime is None or runtime.disabled:
            print("guard_instructions.py: the guard disabled itself", file=sys.stderr)
            os._exit(3)
    os._exit(0)


def client_library(folder: str) -> str | None:
    """The callgrind client request as a shared library, or None (then everything is instrumented)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or not os.path.exists("/usr/include/valgrind/callgrind.h"):
        return None
    source, library = os.path.join(folder, "client.c"), os.path.join(folder, "client.so")
    with open(source, "w") as handle:
        handle.write(CLIENT)
    done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", library, source], capture_output=True)
    return library if done.returncode == 0 else None


def total(out: str) -> int:
    with open(out) as handle:
        for line in handle:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit(f"guard_instructions.py: no totals in {out}")


def count(mode: str, calls: int, folder: str, library: str | None, source: str | None, gc_on: bool,
          real: bool = False) -> int:
    out = os.path.join(folder, f"callgrind.{mode}.{calls}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "TORCH_DISTRIBUTED"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    if source:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    command = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=starmap_next",
               f"--callgrind-out-file={out}"]
    if library:
        command.append("--instr-atstart=no")
    command += [sys.executable, os.path.abspath(__file__), "--measure", mode, str(calls), library or "",
                "1" if gc_on else "", "1" if real else ""]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"guard_instructions.py: the measured process failed:\n{done.stderr[-2000:]}")
    return total(out)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        measured(sys.argv[2], int(sys.argv[3]), sys.argv[4] or None, bool(sys.argv[5]), bool(sys.argv[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", metavar="DIR", help="count the ddpdoctor package under DIR")
    parser.add_argument("--plain", action="store_true", help="count the unguarded no-op call instead")
    parser.add_argument("--gc", action="store_true", help="leave Python's cyclic collector on")
    parser.add_argument("--real", action="store_true", help="call torch's all_reduce, not a no-op")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("guard_instructions.py: needs valgrind (apt-get install valgrind)")
    mode = "plain" if args.plain else "guarded"
    with tempfile.TemporaryDirectory() as folder:
        library = client_library(folder)
        few, many = (count(mode, n, folder, library, args.source, args.gc, args.real) for n in (FEW, MANY))
    print(f"guard_instructions.py: {mode}{' real' if args.real else ''}"
          f"{' ' + args.source if args.source else ''}, gc "
          f"{'on' if args.gc else 'off'}: {(many - few) / (MANY - FEW):,.0f} instructions per call "
          f"(callgrind: {few:,} for {FEW:,} calls, {many:,} for {MANY:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
