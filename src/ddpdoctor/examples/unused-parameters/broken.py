"""F8 unused-parameters: a DDP model with a layer that gets no gradient in some steps.

Run: torchrun --nproc-per-node 2 examples/unused-parameters/broken.py
`aux_head` only takes part when `with_aux=True`. DDP (with the default `find_unused_parameters=False`)
waits for a gradient for every parameter; the first step without one leaves the reduction unfinished,
and the next forward fails with `Expected to have finished reduction in the prior iteration before
starting a new one`, naming the parameter indices (set TORCH_DISTRIBUTED_DEBUG=INFO for their names).
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)
        self.aux_head = torch.nn.Linear(4, 1)  # an auxiliary loss, used on some steps only

    def forward(self, x, with_aux):
        h = torch.relu(self.body(x))
        out = self.head(h)
        return out + self.aux_head(h) if with_aux else out


dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

torch.manual_seed(100 + rank)  # each rank its own batches
for step in range(4):
    x = torch.randn(8, 4)
    loss = model(x, with_aux=step == 0).pow(2).mean()  # steps 1, 2, 3 leave aux_head without a gradient
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {rank}: step {step} loss {loss.item():.4f}", flush=True)

dist.destroy_process_group()
