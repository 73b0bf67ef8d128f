"""accelerate on the CPU (`accelerate launch --multi_gpu --num_processes 2` with `Accelerator(cpu=True)`:
two gloo ranks).

Mode `fixed`: the loader as accelerate users write it (`shuffle=True`, passed to `accelerator.prepare`,
which shards its batches and moves its sampler's epoch), the same with `dispatch_batches=True` (the main
process loads, every rank gets its slice), and a loader over a DistributedSampler of the program's own
whose epoch it sets. Mode `broken`: the same two loaders not prepared and without
`set_epoch`: the first shuffles without sharding (every rank draws from all the data), the second repeats
its order every epoch; then a loader whose generator lives on an accelerator (`torch.Generator("cuda")`;
on a CPU-only torch, which cannot make one, an object that says it is one) fails at its first batch.

The fixed loaders are also run by tests/audits/jobs/runtime/accelerate_job.py's fixed job (`loops(accelerator,
"fixed")`, imported): one 2-rank job for both fixed forms, where two cost the suite ~15 CPU-s more."""

import sys

import torch
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def loops(accelerator: Accelerator, mode: str) -> None:
    """The job's loaders and their three epochs (then, broken, the generator's loader)."""
    data = TensorDataset(torch.arange(16.0))

    shuffled = DataLoader(data, batch_size=4, shuffle=True)
    sampler = DistributedSampler(data, shuffle=True)  # line: built
    own = DataLoader(data, batch_size=4, sampler=sampler)
    dispatched = None
    if mode == "fixed":
        shuffled = accelerator.prepare(shuffled)
        # dispatch_batches=True: the main process loads whole batches and sends each rank its slice
        dispatched = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True), accelerator.device,
                                         put_on_device=True, dispatch_batches=True)

    total = 0.0
    for epoch in range(3):
        if mode == "fixed":
            sampler.set_epoch(epoch)
        for (batch,) in shuffled:  # line: shuffled loop
            total += float(accelerator.reduce(batch, "sum").sum())  # its batches reach the job
        for (batch,) in own:  # line: own loop
            total += float(batch.sum())
        for (batch,) in dispatched or ():
            total += float(batch.sum())
    print(f"rank {accelerator.process_index}: loaders done, total {total}", flush=True)

    if mode == "broken":

        class AcceleratorGenerator:
            """What `torch.Generator(device="cuda")` is to the loader: a generator not on the CPU."""

            device = torch.device("cuda", 0)

        try:
            generator = torch.Generator(device="cuda")
        except RuntimeError:  # a CPU-only torch
            generator = AcceleratorGenerator()
        seeded = DataLoader(data, batch_size=4, generator=generator)
        for (batch,) in seeded:  # line: generator loop
            total += float(batch.sum())


if __name__ == "__main__":
    accelerator = Accelerator(cpu=True)
    loops(accelerator, sys.argv[1])
    print(f"rank {accelerator.process_index}: done", flush=True)
    accelerator.wait_for_everyone()
