"""One-rank NCCL DDP training steps, plain and guarded, in alternating fresh processes.

    .venv/bin/python benchmarks/gpu_step.py [--rounds 4] [--steps 60] [--diagnose]

Two models: a launch-bound one (a 17-layer MLP, batch 64: the host's kernel launches set the pace, so any
time the guard takes from the training thread, or any contention its threads cause, shows) and a
GPU-bound one (a ~150M-parameter transformer encoder stack under bf16 autocast: the GPU sets the pace).
Each step logs its loss through one `all_reduce`, as training loops do. Every measurement is a fresh
process (`ddpdoctor.install()` before torch is imported for the guarded ones); plain and guarded
alternate, round after round, so both see the same machine; the median step of each process is kept and
the median over rounds printed, with the ratio. Needs a CUDA device and NCCL: elsewhere it says so and
exits 2.

`--diagnose` adds two guarded configurations that each take one suspect away, to tell apart where a
slowdown comes from: `guarded-no-gpu-marker` (no CUDA event recorded behind each collective, none
queried) and `guarded-no-monitor` (the monitor thread stopped after start: no heartbeats, no store
traffic, no queries from another thread).
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

MODELS = ("launch-bound", "gpu-bound")
CONFIGS = ("plain", "guarded")
DIAGNOSTIC = ("guarded-no-gpu-marker", "guarded-no-monitor")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build(model_name: str, device: object) -> tuple[object, object, object]:
    """(model, input batch, target) for one of MODELS."""
    import torch

    torch.manual_seed(0)
    if model_name == "launch-bound":
        layers: list[torch.nn.Module] = []
        for _ in range(16):
            layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(256, 10))
        model = torch.nn.Sequential(*layers).to(device)
        return model, torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)
    # ~151M parameters: 12 layers of d_model 1024, 16 heads, feed-forward 4096 (12.6M each)
    layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False),
                                torch.nn.Linear(1024, 10)).to(device)
    return model, torch.randn(8, 512, 1024, device=device), torch.randint(0, 10, (8, 512), device=device)


def worker(model_name: str, config: str, steps: int, on_cpu: bool = False) -> None:
    """One process: a one-rank NCCL group, a DDP model, `steps` timed steps in blocks of 10. `on_cpu`: the
    same code on the CPU with gloo (a smoke run of this script on a machine without a GPU)."""
    if config.startswith("guarded"):
        import ddpdoctor

        ddpdoctor.install(hang_after=600)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if on_cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=0, world_size=1)
        sync = lambda: None  # noqa: E731
    else:
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
        sync = torch.cuda.synchronize
    if config != "plain":
        from ddpdoctor.guard import current_runtime

        runtime = current_runtime()
        if config == "guarded-no-gpu-marker":
            runtime.async_work.track_gpu = False
        elif config == "guarded-no-monitor" and runtime.monitor is not None:
            runtime.monitor.stop(exited=False)
    model, data, target = build(model_name, device)
    ddp = DistributedDataParallel(model, device_ids=None if on_cpu else [0])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=model_name == "gpu-bound"):
            out = ddp(data)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        metric = loss.detach().clone()
        dist.all_reduce(metric)  # the logged loss

    for _ in range(2 if on_cpu else 10):
        step()
    sync()
    per_step = []
    for _ in range(max(1, steps // 10)):
        start = time.perf_counter()
        block = 1 if on_cpu else 10
        for _ in range(block):
            step()
        sync()
        per_step.append((time.perf_counter() - start) / block)
    print(json.dumps({"step": statistics.median(per_step), "params": params}), flush=True)
    dist.destroy_process_group()


def measure(model_name: str, config: str, steps: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPDOCTOR_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", model_name, config, "--steps", str(steps)],
        env=env, capture_output=True, text=True, timeout=600, start_new_session=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"gpu_step.py: the {config} {model_name} process failed:\n{done.stderr[-2000:]}")
    return {k: float(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="plain/guarded pairs per model (default 4)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per process (default 60)")
    parser.add_argument("--diagnose", action="store_true",
                        help="also the guard without its GPU markers, and without its monitor thread")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--worker-on-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.steps, args.worker_on_cpu)
        return 0
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("gpu_step.py: needs torch with CUDA and NCCL; torch is not installed here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print(f"gpu_step.py: needs a CUDA device and NCCL; this machine has none (torch {torch.__version__}, "
              f"CUDA available: {torch.cuda.is_available()}, NCCL: {dist.is_nccl_available()}). Run it on a "
              "GPU machine.", file=sys.stderr)
        return 2
    print(f"one rank, NCCL, {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; {args.rounds} rounds of fresh processes, "
          f"plain and guarded alternating, median step of {args.steps} per process", flush=True)
    for model_name in MODELS:
        configs = CONFIGS + (DIAGNOSTIC if args.diagnose else ())
        times: dict[str, list[float]] = {config: [] for config in configs}
        params = 0.0
        for round_index in range(args.rounds):
            # ABBA order (every other round reversed) so a drift of the machine over the run (clocks, heat,
            # a neighbour) falls on both sides alike instead of on whichever config runs first
            for config in configs if round_index % 2 == 0 else configs[::-1]:
                result = measure(model_name, config, args.steps)
                times[config].append(result["step"])
                params = result["params"]
        plain, guarded = (statistics.median(times[c]) for c in CONFIGS)
        ratio = guarded / plain
        print(f"{model_name} ({params / 1e6:.1f}M parameters): plain {plain * 1e3:.3f} ms, guarded "
              f"{guarded * 1e3:.3f} ms per step: {ratio:.4f}x ({(ratio - 1) * 100:+.2f} %)"
              f"  [plain {', '.join(f'{t * 1e3:.3f}' for t in times['plain'])}; guarded "
              f"{', '.join(f'{t * 1e3:.3f}' for t in times['guarded'])} ms]", flush=True)
        for config in configs[2:]:
            alone = statistics.median(times[config])
            print(f"  {config}: {alone * 1e3:.3f} ms per step: {alone / plain:.4f}x of plain", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
