"""F3 foreign-device-hooks, fixed: one owner of device placement, the rank's own device.

Needs 2 GPUs to show the difference:  torchrun --nproc-per-node 2 examples/foreign-device-hooks/fixed.py
Without GPUs:                         python examples/foreign-device-hooks/fixed.py   (the CPU part)

Load with `device_map={"": local_rank}` (or no device_map at all) under DDP: the hooks, if any, then agree
with the device the strategy chose, so inputs and weights meet on the same GPU on every rank.
"""

import os

import torch
from accelerate.hooks import attach_align_device_hook


def build_model(execution_device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    # device_map={"": local_rank}: the hooks pin every layer to this rank's device.
    attach_align_device_hook(model, execution_device=execution_device)
    return model


def foreign_hooks(model):
    hooked = [(name, module) for name, module in model.named_modules() if hasattr(module, "_hf_hook")]
    return [(name or "<root>", module._hf_hook) for name, module in hooked]


if torch.cuda.device_count() >= 2:
    import torch.distributed as dist

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = build_model(execution_device=local_rank)  # the same device the strategy uses
    model.to(f"cuda:{local_rank}")
    out = model(torch.randn(4, 8, device=f"cuda:{local_rank}"))
    print(f"rank {local_rank}: forward ok, output on {out.device}")
    dist.destroy_process_group()
else:
    model = build_model(execution_device="cpu")
    print("CPU part (no GPUs here): modules carrying accelerate hooks, and the device each one forces")
    for name, hook in foreign_hooks(model):
        print(f"  {name}: {type(hook).__name__}(execution_device={hook.execution_device})")
    print("under DDP each rank would load with device_map={'': local_rank}: hooks and strategy agree")
    print(f"forward on CPU works here: output shape {tuple(model(torch.randn(4, 8)).shape)}")
