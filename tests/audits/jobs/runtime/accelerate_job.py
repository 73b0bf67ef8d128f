"""F10 + F3 under `accelerate launch --multi_gpu --num_processes 2 accelerate_job.py OUT_DIR broken|fixed`
with `Accelerator(cpu=True)`.

broken: a layer carries accelerate's AlignDevicesHook pinned to another device than the rank's, and every
process writes the weights with safetensors' `save_file` to the same file.
fixed: the hook moves to the process's own device; the weights are written by `accelerator.save_model`
(main process only) and `accelerator.save_state` (shared files once, per-process RNG files apart); then the
fixed loaders of ../loaders/accelerate_loop.py (their test, tests/audits/test_runtime_loaders.py, reads this
run: one 2-rank job for both fixed forms).
"""

import os
import sys

import torch
from accelerate import Accelerator
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from safetensors.torch import save_file
from torch import nn

out, variant = sys.argv[1], sys.argv[2]
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
add_hook_to_module(model[2], AlignDevicesHook(execution_device="cpu"))  # the process's own device
if variant == "broken":
    # A hook still sending inputs to the device chosen at load (cuda:0 on every process of a GPU node) while
    # the weights are on this process's device. A CPU-only stand-in: meta.
    model[2]._hf_hook.execution_device = torch.device("meta")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)  # line: prepare

if variant == "broken":
    weights = accelerator.unwrap_model(model).state_dict()
    save_file(weights, os.path.join(out, "model.safetensors"))  # line: every rank saves
else:
    accelerator.save_model(model, out)
    accelerator.save_state(os.path.join(out, "state"))
accelerator.backward(model(torch.randn(4, 8)).sum())
optimizer.step()
if variant == "fixed":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "loaders"))
    from accelerate_loop import loops

    loops(accelerator, "fixed")
accelerator.wait_for_everyone()
print(f"rank {accelerator.process_index}: done")
accelerator.end_training()
