"""F10 + F3 under Lightning (`python lightning_job.py OUT_DIR broken|fixed [run|install|callback REPORT]`,
2 CPU processes, DDP).

How the guard gets in: `run` (the default) is `ddpdoctor run -- python lightning_job.py ...`, nothing in the
program; `install` calls `ddpdoctor.install(report_dir=REPORT)` before the Trainer; `callback` passes
`DoctorCallback(report_dir=REPORT)` to it.

broken: a layer carries accelerate's AlignDevicesHook pinned to another device than the rank's (what
`from_pretrained(..., device_map="auto")` leaves behind), and every rank writes the initial weights and a
checkpoint through the strategy's checkpoint IO to the same files.
fixed: the hook moves to the rank's own device; the initial weights are written by global rank 0 only, and
the checkpoint by `trainer.save_checkpoint`, which every rank calls and Lightning writes once.
"""

import os
import sys

import lightning as L
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

out, variant = sys.argv[1], sys.argv[2]
how, report = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else ("run", None)


class Model(L.LightningModule):  # line: model class
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        add_hook_to_module(self.head, AlignDevicesHook(execution_device="cpu"))  # the rank's own device
        if variant == "broken":
            # Rank 1 of a 2-GPU node after the strategy's `.to("cuda:1")`: weights on the rank's device, the
            # hook still sending inputs to the device chosen at load (cuda:0). A CPU-only stand-in: meta.
            self.head._hf_hook.execution_device = torch.device("meta")

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.head(self.body(x)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_fit_start(self) -> None:
        if variant == "broken":
            torch.save(self.state_dict(), os.path.join(out, "init.pt"))  # line: every rank saves
            io = self.trainer.strategy.checkpoint_io
            state = {"state_dict": self.state_dict()}
            io.save_checkpoint(state, os.path.join(out, "init.ckpt"))  # line: every rank io
        elif self.trainer.is_global_zero:
            torch.save(self.state_dict(), os.path.join(out, "init.pt"))


if __name__ == "__main__":
    torch.manual_seed(0)
    callbacks = []
    if how == "install":
        import ddpdoctor

        ddpdoctor.install(report_dir=report)
    elif how == "callback":
        from ddpdoctor.lightning import DoctorCallback

        callbacks.append(DoctorCallback(report_dir=report))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, limit_train_batches=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    data = DataLoader(TensorDataset(torch.randn(8, 8)), batch_size=2)
    trainer.fit(Model(), data)  # line: fit
    trainer.save_checkpoint(os.path.join(out, "last.ckpt"))
    print(f"rank {trainer.global_rank}: fit done")
