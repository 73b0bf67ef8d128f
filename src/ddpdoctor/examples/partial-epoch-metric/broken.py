"""F5 partial-epoch-metric: a "whole validation set" AUC computed on each rank's shard only.

Run: python examples/partial-epoch-metric/broken.py   (2 CPU processes, DDP over gloo)
Nothing crashes. Under DDP each rank validates half of the data, so `torch.cat(self.val_scores)` in
`on_validation_epoch_end` is one shard, and `sync_dist=True` averages the two shard AUCs, which is not
the AUC of the whole set. The last lines of this script (not part of the bug) compute the real AUC and
exit 1 when the logged value differs, so that the silent error becomes visible.
"""

import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Probability that a random positive scores above a random negative (ties count half)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).float() + 0.5 * (pos[:, None] == neg[None, :]).float()
    return wins.mean().item()


class Scorer(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        with torch.no_grad():  # a "trained" scorer, fixed so that the numbers are reproducible
            self.layer.weight.copy_(torch.tensor([[1.0, 0.5, 0.0, 0.0]]))
            self.layer.bias.zero_()
        self.val_scores, self.val_labels = [], []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_scores.append(self.layer(x).squeeze(1))
        self.val_labels.append(y)

    def on_validation_epoch_end(self):
        scores, labels = torch.cat(self.val_scores), torch.cat(self.val_labels)  # this rank's shard only
        self.val_scores.clear()
        self.val_labels.clear()
        shard_auc = auc(scores, labels)
        print(f"rank {self.global_rank}: AUC of its {len(labels)} samples = {shard_auc:.4f}", flush=True)
        self.log("val_auc", shard_auc, sync_dist=True)  # the mean of the shard AUCs


def validation_data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 4, generator=g)
    y = (x[:, 0] + torch.randn(40, generator=g) > 0).long()
    return x, y


if __name__ == "__main__":
    x, y = validation_data()
    model = Scorer()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(model, DataLoader(TensorDataset(x, y), batch_size=5))

    # --- not part of the bug: compare with the AUC of the whole validation set -------------------------
    logged = trainer.callback_metrics["val_auc"].item()
    with torch.no_grad():
        whole = auc(model.layer(x).squeeze(1), y)
    if trainer.is_global_zero:
        verdict = "correct" if abs(logged - whole) < 1e-6 else "WRONG"
        print(f"logged val_auc = {logged:.4f}; AUC of the whole validation set = {whole:.4f}: {verdict}")
    sys.exit(0 if abs(logged - whole) < 1e-6 else 1)
