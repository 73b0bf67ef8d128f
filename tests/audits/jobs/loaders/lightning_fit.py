"""Lightning DDP on the CPU, started with plain `python` (Lightning starts rank 1 itself).

Mode `broken`: `use_distributed_sampler=False` and a bucketing sampler that holds a shuffling
DistributedSampler and does not forward `set_epoch`: Lightning calls `set_epoch` on `loader.sampler` only,
so the inner sampler's epoch never moves. Mode `callback`: the same with `DoctorCallback()`, and `fit` inside
`trainer.init_module()` (a finding only the callback makes). Mode `fixed`: the loader as Lightning users
write it (`shuffle=True`; Lightning adds its DistributedSampler and moves its epoch), with the callback."""

import sys
from collections.abc import Iterator

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

MODE = sys.argv[1]
DATA = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))


class BucketSampler(Sampler[int]):
    def __init__(self, inner: DistributedSampler) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[int]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        if MODE == "fixed":
            return DataLoader(DATA, batch_size=4, shuffle=True)
        inner = DistributedSampler(DATA, shuffle=True)  # line: built
        return DataLoader(DATA, batch_size=4, sampler=BucketSampler(inner))


if __name__ == "__main__":
    callbacks = []
    if MODE in ("callback", "fixed"):
        from ddpdoctor.lightning import DoctorCallback

        callbacks.append(DoctorCallback())
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, callbacks=callbacks,
                         use_distributed_sampler=MODE == "fixed", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    if MODE == "callback":
        with trainer.init_module():
            trainer.fit(Regressor())  # line: fit in init_module
    else:
        trainer.fit(Regressor())  # line: fit
    print(f"rank {trainer.global_rank}: fit done", flush=True)
