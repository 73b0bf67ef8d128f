"""F2 init-module-scope: data and `fit` inside `trainer.init_module()`.

Needs 2 GPUs for the failure:  python examples/init-module-scope/broken.py
Without GPUs:                  the same command runs the CPU part (see below)

`trainer.init_module()` makes the strategy's device the default device for every tensor created inside the
block. Here the data module and `trainer.fit` sit inside it too, so on GPUs (`strategy="ddp"`)
DistributedSampler's shuffle (`torch.randperm(n, generator=<cpu generator>)`) runs under a cuda default
device and fails with `RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'`,
followed by `Please call iter(combined_loader) first.` (`ddp_spawn` hides it.)

CPU part (no GPU present): one CPU process runs the same code and prints the default device that the data
and the sampler see inside the block; on a GPU node it is the rank's cuda device.
"""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RandomData(L.LightningDataModule):
    def setup(self, stage):
        self.dataset = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
        print(f"rank {self.trainer.global_rank}: default device inside trainer.init_module(): "
              f"{torch.get_default_device()}", flush=True)

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=8, shuffle=True)


if __name__ == "__main__":
    gpus = torch.cuda.device_count()
    on_gpus = dict(accelerator="gpu", devices=2, strategy="ddp") if gpus >= 2 else dict(accelerator="cpu", devices=1)
    trainer = L.Trainer(**on_gpus, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with trainer.init_module():
        model = Regressor()
        data = RandomData()  # data built under the device context ...
        trainer.fit(model, data)  # ... and the whole fit, sampler included, runs inside it
    print("fit finished" + ("" if gpus >= 2 else " (CPU part: on 2 GPUs this fit fails in the sampler)"))
