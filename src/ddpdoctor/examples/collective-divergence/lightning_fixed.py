"""F4 collective-divergence (Lightning), fixed: every rank runs the same logging.

Run: python examples/collective-divergence/lightning_fixed.py   (2 CPU processes, DDP over gloo)
Every rank calls `self.log(..., sync_dist=True)`, so every rank enters the metric's all_reduce. (To log from
rank 0 only, use `self.log(..., rank_zero_only=True)`, which does not sync.)
"""

import os
from datetime import timedelta

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.loss_sum, self.batches = 0.0, 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.loss_sum += torch.nn.functional.mse_loss(self.layer(x), y).item()
        self.batches += 1

    def on_validation_epoch_end(self):
        val_metric = torch.tensor(self.loss_sum / self.batches)
        self.loss_sum, self.batches = 0.0, 0
        self.log("val_metric", val_metric, sync_dist=True)  # every rank enters the all_reduce

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)


if __name__ == "__main__":
    # The timeout bounds the rendezvous too, and Lightning starts rank 1 only after rank 0 has imported it:
    # 10 s failed this fixed script on a busy machine (rank 1 still importing). Nothing here waits on it.
    timeout = timedelta(seconds=float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "60")))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(timeout=timeout),
        max_epochs=2,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), loader(), loader())
    if trainer.is_global_zero:
        print(f"val_metric = {trainer.callback_metrics['val_metric'].item():.4f}")
