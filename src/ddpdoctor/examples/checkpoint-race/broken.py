"""F10 checkpoint-race: every rank saves to the same checkpoint path.

Run: torchrun --nproc-per-node 2 examples/checkpoint-race/broken.py
Both ranks write `checkpoint.pt` at the same moment. The file ends up holding whichever rank wrote last (or,
when the writes interleave, a torn file that `torch.load` cannot read), so the rank-local state in it (here
the data position and RNG state) belongs to an arbitrary rank. After a barrier each rank reads the file back;
at least one of them finds someone else's checkpoint and exits 1.
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
# One folder per job (MASTER_PORT is unique per torchrun job), shared by its ranks.
folder = Path(tempfile.gettempdir()) / f"ddpdoctor-example-{os.environ['MASTER_PORT']}"
folder.mkdir(exist_ok=True)
path = folder / "checkpoint.pt"

torch.manual_seed(rank)
model = torch.nn.Linear(64, 64)  # DDP would keep these equal; the rank-local state below is not
state = {"model": model.state_dict(), "written_by": rank, "samples_seen": 1000 * (rank + 1),
         "rng": torch.get_rng_state()}
for _ in range(5):
    torch.save(state, path)  # every rank, same path

dist.barrier()
# --- not part of the bug: read back what a resumed run would load ------------------------------------------
try:
    loaded = torch.load(path)
    verdict = "mine" if loaded["written_by"] == rank else f"written by rank {loaded['written_by']}"
except Exception as exc:  # a torn file
    verdict = f"unreadable ({type(exc).__name__}: {exc})"
print(f"rank {rank}: checkpoint {path.name} is {verdict}", flush=True)
dist.barrier()
if rank == 0:
    path.unlink(missing_ok=True)
    folder.rmdir()
dist.barrier()  # no rank tears the group down while a peer still uses it
dist.destroy_process_group()
sys.exit(0 if verdict == "mine" else 1)
