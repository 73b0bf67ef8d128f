"""F10 checkpoint-race, fixed: rank 0 writes the checkpoint, the others wait for it.

Run: torchrun --nproc-per-node 2 examples/checkpoint-race/fixed.py
Only rank 0 saves (write to a temporary name, then rename, so a crash never leaves a torn file), and a
barrier keeps the other ranks from reading it early. Rank-local state that must survive a restart goes to a
per-rank file (`checkpoint-rank{rank}.pt`). Lightning and accelerate already save from rank 0 only
(`trainer.save_checkpoint`, `accelerator.save_state`).
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
folder = Path(tempfile.gettempdir()) / f"ddpdoctor-example-{os.environ['MASTER_PORT']}"
folder.mkdir(exist_ok=True)
path = folder / "checkpoint.pt"

torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
if rank == 0:
    state = {"model": model.state_dict(), "written_by": rank, "samples_seen": 2000}
    partial = path.with_suffix(".tmp")
    torch.save(state, partial)
    os.replace(partial, path)  # atomic: readers see the old file or the new one, never half of one
dist.barrier()  # nobody reads before rank 0 has finished writing

# --- read back what a resumed run would load ----------------------------------------------------------------
loaded = torch.load(path)
verdict = "rank 0's" if loaded["written_by"] == 0 else f"written by rank {loaded['written_by']}"
print(f"rank {rank}: checkpoint {path.name} is {verdict}", flush=True)
dist.barrier()
if rank == 0:
    path.unlink(missing_ok=True)
    folder.rmdir()
dist.barrier()  # no rank tears the group down while a peer still uses it
dist.destroy_process_group()
sys.exit(0 if verdict == "rank 0's" else 1)
