"""F2 init-module-scope, fixed: only the model is built inside `trainer.init_module()`.

Needs 2 GPUs to show the difference:  python examples/init-module-scope/fixed.py
Without GPUs:                         the same command runs the CPU part

The data module, its loaders (and their samplers and generators) and `trainer.fit` are outside the block,
so they see the normal CPU default device; the model's parameters are still created on the GPU directly.
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
        print(f"rank {self.trainer.global_rank}: default device while building the data: "
              f"{torch.get_default_device()}", flush=True)

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=8, shuffle=True)


if __name__ == "__main__":
    gpus = torch.cuda.device_count()
    on_gpus = dict(accelerator="gpu", devices=2, strategy="ddp") if gpus >= 2 else dict(accelerator="cpu", devices=1)
    trainer = L.Trainer(**on_gpus, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with trainer.init_module():
        model = Regressor()  # only the model: its parameters are created on the device directly
    data = RandomData()
    trainer.fit(model, data)
    print("fit finished" + ("" if gpus >= 2 else " (CPU part)"))
