"""The DDP101 fix, end to end: a Lightning module that logs with `sync_dist=True` under
`if self.trainer.is_global_zero:` is fixed by `ddpdoctor check --fix` (the log moves out of the branch), and
the fixed module then trains to the end on 2 CPU ranks (gloo), every rank holding the synced value. Slow
(two real processes, ~20 s): `pytest -m slow`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""\
    import torch
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset


    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            pass

        def on_validation_epoch_end(self):
            value = torch.tensor(float(self.global_rank))  # 0 on rank 0, 1 on rank 1
            if self.trainer.is_global_zero:
                self.log("val_metric", value, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    if __name__ == "__main__":
        data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
                             limit_train_batches=2, limit_val_batches=2, num_sanity_val_steps=0,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(Model(), data, data)
        metric = trainer.callback_metrics["val_metric"].item()
        print("FINISHED rank", trainer.global_rank, "val_metric", metric, flush=True)
""")


@pytest.mark.slow
def test_fixed_module_trains_on_two_ranks(check, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    assert check(str(script), "--isolated", "--fix").code == 0
    fixed = script.read_text(encoding="utf-8")
    assert "    def on_validation_epoch_end(self):\n        value = torch.tensor(" in fixed
    assert '# 0 on rank 0, 1 on rank 1\n        self.log("val_metric", value, sync_dist=True)\n' in fixed
    process = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)  # Lightning's second rank is a child of this one
            process.wait(timeout=10)
    assert process.returncode == 0, out[-3000:]
    # every rank logged, and what each holds is the mean over the ranks, not rank 0's own 0.0
    assert "FINISHED rank 0 val_metric 0.5" in out and "FINISHED rank 1 val_metric 0.5" in out, out[-3000:]
