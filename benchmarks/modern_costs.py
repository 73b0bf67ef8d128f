"""The per-call costs of the guard's hooks for the modern classes (one process, no backend):

- F11: the forward counter on a sharded root, per forward pass: on a module that already has a forward
  pre-hook (what FSDP's root has: the counter alone) and on a bare module (where the first hook also moves
  torch's `Module.__call__` off its fast path: what it adds to a DDP model);
- F11: the backward counter (the wrapper of `torch.autograd.backward`), per backward pass, against the same
  backward unwrapped; and what a module-level backward hook (`register_full_backward_pre_hook` on the root)
  would cost each forward instead, the alternative it was chosen over;
- F12: the replica digest (sum and norm of every parameter) of models of a few sizes, per digest;
- F13: the monitor's sample of its main thread, per heartbeat (the monitor's thread, not the training one).

    .venv/bin/python benchmarks/modern_costs.py      (guard_overhead.py prints the same lines)
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable


def _per_call(call: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n


def _alternating(
    off: Callable[[], object], on: Callable[[], object], n: int, rounds: int
) -> tuple[float, float]:
    """Medians over alternating blocks (the machine's load changes between blocks, not within a pair)."""
    offs, ons = [], []
    for _ in range(rounds):
        offs.append(_per_call(off, n))
        ons.append(_per_call(on, n))
    return statistics.median(offs), statistics.median(ons)


def forward_counter_cost(n: int = 20000, rounds: int = 15) -> dict[str, float]:
    import timeit

    import torch

    from ddpdoctor.audits.forward_counts import count_forwards

    torch.set_num_threads(1)
    x = torch.zeros(1, 1)
    hooked_off, hooked_on = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    for module in (hooked_off, hooked_on):  # stands for FSDP's own pre-forward hook
        module.register_forward_pre_hook(lambda module, args: None)
    counter = count_forwards(hooked_on, "fully_shard")
    bare_off, bare_on = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    count_forwards(bare_on, "DistributedDataParallel")
    with torch.no_grad():
        off, on = _alternating(lambda: hooked_off(x), lambda: hooked_on(x), n, rounds)
        bare, counted = _alternating(lambda: bare_off(x), lambda: bare_on(x), n, rounds)

    # the hook's own work, against an empty hook called the same way (less noisy than whole forwards)
    def empty(module: object, args: object) -> None:
        return None

    calls = 200_000
    hook_alone = min(timeit.repeat(lambda: counter.hook(None, ()), number=calls, repeat=9)) / calls
    empty_alone = min(timeit.repeat(lambda: empty(None, ()), number=calls, repeat=9)) / calls
    return {
        "sharded_root": on - off,
        "bare_module": counted - bare,
        "forward": off,
        "hook_alone": hook_alone - empty_alone,
    }


def backward_counter_cost(n: int = 300, rounds: int = 7) -> dict[str, float]:
    import torch

    from ddpdoctor.audits import backward_counts

    torch.set_num_threads(1)
    module = torch.nn.Linear(1, 1)
    x = torch.zeros(1, 1)

    def step() -> None:
        module(x).sum().backward()

    backward_counts.forget()
    plain: list[float] = []
    counted: list[float] = []
    for _ in range(rounds):  # alternating blocks: wrapped and not
        plain.append(_per_call(step, n))
        backward_counts.count_backwards()
        counted.append(_per_call(step, n))
        backward_counts.forget()
    hooked = torch.nn.Linear(1, 1)
    hooked.register_full_backward_pre_hook(lambda module, grad: None)
    with torch.no_grad():  # the forward alone: what the hook costs where no backward follows
        bare_forward, hooked_forward = _alternating(lambda: module(x), lambda: hooked(x), n * 5, rounds)
    with torch.enable_grad():
        grad_bare, grad_hooked = _alternating(lambda: module(x), lambda: hooked(x), n * 5, rounds)
    import timeit

    def through_torch() -> None:  # the depth of the real call: user -> Tensor.backward -> the wrapper
        backward_counts.COUNT.note()

    calls = 20_000
    note = min(timeit.repeat(lambda: through_torch(), number=calls, repeat=9)) / calls
    empty = min(timeit.repeat(lambda: (lambda: None)(), number=calls, repeat=9)) / calls
    return {
        "note_alone": note - empty,
        "wrapper": statistics.median(counted) - statistics.median(plain),
        "step": statistics.median(plain),
        "hook_forward_no_grad": hooked_forward - bare_forward,
        "hook_forward_grad": grad_hooked - grad_bare,
    }


def digest_cost(rounds: int = 5) -> dict[str, float]:
    import torch

    from ddpdoctor.audits.replicas import digest_of

    out = {}
    for tensors, size in ((20, 50_000), (100, 100_000), (200, 500_000)):
        model = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(size)) for _ in range(tensors))
        digest_of(model, 0)  # warm
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            digest_of(model, 0)
            times.append(time.perf_counter() - start)
        out[f"{tensors * size / 1e6:g}M parameters in {tensors} tensors"] = statistics.median(times)
    return out


def progress_sample_cost(n: int = 2000) -> float:
    from ddpdoctor.guard.rank.progress import MainThreadProgress

    probe = MainThreadProgress(threading.main_thread().ident)
    result: list[float] = []
    thread = threading.Thread(target=lambda: result.append(_per_call(probe.sample, n)))
    thread.start()
    thread.join()
    return result[0]


def report(print_line: Callable[[str], object]) -> None:
    counter = forward_counter_cost()
    print_line(
        f"forward counter (F11), per forward pass: the hook's own work {counter['hook_alone'] * 1e6:+.2f} µs "
        f"over an empty hook; whole forwards (noisy): {counter['sharded_root'] * 1e6:+.2f} µs on a root "
        f"that has a pre-hook already (FSDP's), {counter['bare_module'] * 1e6:+.2f} µs on a bare module "
        f"(DDP's: the first hook leaves Module.__call__'s fast path), against a "
        f"{counter['forward'] * 1e6:.1f} µs forward"
    )
    backward = backward_counter_cost()
    print_line(
        f"backward counter (F11), per backward pass: its own work {backward['note_alone'] * 1e6:+.2f} µs; "
        f"whole steps (noisy): {backward['wrapper'] * 1e6:+.2f} µs against a "
        f"{backward['step'] * 1e6:.1f} µs forward+backward of a 1x1 Linear (nothing per forward); a module "
        f"backward hook instead would add {backward['hook_forward_grad'] * 1e6:+.2f} µs to every forward "
        f"under grad ({backward['hook_forward_no_grad'] * 1e6:+.2f} µs under no_grad)"
    )
    for label, seconds in digest_cost().items():
        print_line(f"replica digest (F12), per digest (a pass of the schedule, of the clock, or after a "
                   f"checkpoint save), CPU, 1 thread: {seconds * 1e3:.2f} ms for {label}")
    sample = progress_sample_cost()
    print_line(f"main-thread sample (F13), per heartbeat, on the monitor's thread: {sample * 1e6:.1f} µs")


if __name__ == "__main__":
    report(print)
