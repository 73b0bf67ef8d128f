"""F3 foreign-device-hooks: accelerate's device hooks and the DDP strategy both place the same module.

Needs 2 GPUs for the failure:  torchrun --nproc-per-node 2 examples/foreign-device-hooks/broken.py
Without GPUs:                  python examples/foreign-device-hooks/broken.py   (the CPU part, see below)

What `from_pretrained(..., device_map="auto")` does on a node where each process sees every GPU: accelerate
attaches an `AlignDevicesHook(execution_device=0)` to every layer, which moves the layer's inputs to cuda:0
before each forward. The DDP strategy then moves the model to the rank's own device (`model.to("cuda:1")` on
rank 1). Rank 0 works; rank 1 fails in forward with
`Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cuda:1!`.

CPU part (no GPU present): the same model gets the same real accelerate hooks, on the CPU, and the script
prints what a DDP rank would see: every module carrying a foreign hook and the device it forces.
"""

import os

import torch
from accelerate.hooks import attach_align_device_hook


def build_model(execution_device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    # What device_map="auto" leaves behind: a hook on every leaf module, pinned to one device.
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
    model = build_model(execution_device=0)  # accelerate's choice: cuda:0, on every rank
    model.to(f"cuda:{local_rank}")  # the DDP strategy's choice: the rank's own device
    out = model(torch.randn(4, 8, device=f"cuda:{local_rank}"))  # rank 1: cuda:0 inputs, cuda:1 weights
    print(f"rank {local_rank}: forward ok, output on {out.device}")
    dist.destroy_process_group()
else:
    model = build_model(execution_device="cpu")
    rank_device = "cuda:1"  # what the DDP strategy would pick on rank 1 of a 2-GPU node
    print("CPU part (no GPUs here): modules carrying accelerate hooks, and the device each one forces")
    for name, hook in foreign_hooks(model):
        print(f"  {name}: {type(hook).__name__}(execution_device={hook.execution_device})")
    print(f"under DDP on rank 1 the strategy moves these weights to {rank_device}, while hooks loaded with "
          "device_map='auto' move the inputs to cuda:0 -> 'Expected all tensors to be on the same device'")
    print(f"forward on CPU works here: output shape {tuple(model(torch.randn(4, 8)).shape)}")
