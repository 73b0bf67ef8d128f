"""F4 collective-divergence (Lightning): `self.log(..., sync_dist=True)` under `if self.trainer.is_global_zero`.

Run: python examples/collective-divergence/lightning_broken.py   (2 CPU processes, DDP over gloo)
`sync_dist=True` makes the log a collective. Rank 0 enters the metric's sync (a barrier, then an all_reduce,
in lightning/fabric/utilities/distributed.py) alone: Lightning runs it later, in its logger connector, so no
line of this file is on the stack. Rank 1 trains on into the next epoch and waits in DDP's gradient
all_reduce. The job hangs until the process group's timeout: DDPDOCTOR_EXAMPLE_TIMEOUT seconds (default 10)
here instead of the default 30 minutes; then gloo reports `Application timeout caused pair closure` and
`Connection closed by peer`.
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
        if self.trainer.is_global_zero:
            self.log("val_metric", val_metric, sync_dist=True)  # a collective, entered by rank 0 only

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)


if __name__ == "__main__":
    timeout = timedelta(seconds=float(os.environ.get("DDPDOCTOR_EXAMPLE_TIMEOUT", "10")))
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
