"""`DoctorCallback` with real Lightning on the CPU: audits warn at the right moment and never stop the fit.

In-process fits pass `guard=False` so that the guard's process-wide patches do not outlive the test; the
guard's installation is checked in a fresh process, and so is the 2-rank DDP job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from ports import free_port
from processes import TOKEN_VARIABLE, run_in_session
from samplers import BucketSampler
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpdoctor.audits import AuditWarning
from ddpdoctor.lightning import DoctorCallback

DATA = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_trainer(callback: DoctorCallback, max_epochs: int = 2) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def classes(callback: DoctorCallback) -> list[str]:
    return [f.class_ for f in callback.findings]


# ------------------------------------------------------------------------- init_module around fit (F2)


def test_fit_inside_init_module_is_reported_and_training_goes_on() -> None:
    callback = DoctorCallback(guard=False)
    trainer = make_trainer(callback)
    with pytest.warns(AuditWarning, match="init-module-scope"):
        with trainer.init_module():
            model = Regressor()
            trainer.fit(model, DataLoader(DATA, batch_size=4, shuffle=True))
    assert classes(callback) == ["init-module-scope"]
    assert callback.findings[0].facts == {"default_device": "cpu", "scoped": True}
    assert trainer.current_epoch == 2  # a warning, not a stop


def test_fit_outside_init_module_is_clean() -> None:
    callback = DoctorCallback(guard=False)
    trainer = make_trainer(callback)
    with trainer.init_module():
        model = Regressor()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditWarning)
        trainer.fit(model, DataLoader(DATA, batch_size=4, shuffle=True))
    assert callback.findings == []


def test_device_context_is_reported_before_the_sampler_fails() -> None:
    """The original report's chain, on the CPU: the meta device plays CUDA's part."""
    callback = DoctorCallback(guard=False)
    trainer = make_trainer(callback)
    model, loader = Regressor(), DataLoader(DATA, batch_size=4, shuffle=True)
    with pytest.warns(AuditWarning, match="init-module-scope") as record:
        with pytest.raises(RuntimeError, match="iter\\(combined_loader\\)") as failure:
            with torch.device("meta"):
                trainer.fit(model, loader)
    assert "meta" in str(failure.value.__context__)  # the sampler's draw on the wrong device
    assert len(record) >= 1
    (finding,) = callback.findings
    assert finding.severity.value == "error"
    assert finding.facts["default_device"] == "meta"


def test_generator_on_an_accelerator_is_reported_when_lightning_gets_the_loader() -> None:
    try:
        generator = torch.Generator(device="cuda")
    except RuntimeError:
        pytest.skip("this torch build cannot create a CUDA generator (CPU-only machine)")
    callback = DoctorCallback(guard=False)
    trainer = make_trainer(callback)
    with pytest.warns(AuditWarning, match="init-module-scope"), pytest.raises(RuntimeError):
        trainer.fit(Regressor(), DataLoader(DATA, batch_size=4, shuffle=True, generator=generator))
    assert [f.facts.get("attribute") for f in callback.findings] == ["generator"]


# ------------------------------------------------------------------------------- the model (F3)


def test_accelerate_hook_on_the_lightning_module_is_reported_at_fit_start() -> None:
    model = Regressor()
    add_hook_to_module(model.layer, AlignDevicesHook(execution_device="cpu"))
    callback = DoctorCallback(guard=False)
    trainer = make_trainer(callback)

    with pytest.warns(AuditWarning, match="foreign-device-hooks"):
        trainer.fit(model, DataLoader(DATA, batch_size=4))

    (finding,) = callback.findings
    assert finding.class_ == "foreign-device-hooks"
    assert "`layer`" in finding.evidence[0].text
    assert finding.facts["rank_device"] == "cpu"
    assert trainer.current_epoch == 2


# ---------------------------------------------------------------------------------- samplers (F7)


def test_nested_distributed_sampler_without_set_epoch_is_reported() -> None:
    sampler = BucketSampler(DistributedSampler(DATA, num_replicas=1, rank=0))
    callback = DoctorCallback(guard=False)
    trainer = make_trainer(callback, max_epochs=3)

    with pytest.warns(AuditWarning, match="sampler-epoch"):
        trainer.fit(Regressor(), DataLoader(DATA, batch_size=4, sampler=sampler))

    (finding,) = callback.findings
    assert finding.class_ == "sampler-epoch"
    assert finding.facts["sampler"] == "sampler.base_sampler"
    assert sampler.base_sampler.epoch == 0


def test_distributed_sampler_lightning_can_reach_is_clean() -> None:
    sampler = DistributedSampler(DATA, num_replicas=1, rank=0)
    callback = DoctorCallback(guard=False)
    trainer = make_trainer(callback, max_epochs=3)
    trainer.fit(Regressor(), DataLoader(DATA, batch_size=4, sampler=sampler))
    assert callback.findings == []
    assert sampler.epoch == 2


def test_a_nested_sampler_whose_epoch_the_module_forwards_is_clean() -> None:
    """The fix the finding recommends, done in the module's own `on_train_epoch_start`: Lightning runs it
    after the callbacks' hook, so the audit must look later than that."""
    sampler = BucketSampler(DistributedSampler(DATA, num_replicas=1, rank=0))

    class Forwarding(Regressor):
        def on_train_epoch_start(self) -> None:
            sampler.base_sampler.set_epoch(self.current_epoch)

    callback = DoctorCallback(guard=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditWarning)
        make_trainer(callback, max_epochs=3).fit(
            Forwarding(), DataLoader(DATA, batch_size=4, sampler=sampler)
        )
    assert callback.findings == [] and sampler.base_sampler.epoch == 2


def test_a_callback_reused_across_fits_judges_each_fit_on_its_own() -> None:
    """Each fit restarts at epoch 0, and Lightning sets epoch 0 on a reused loader's sampler again."""
    loader = DataLoader(DATA, batch_size=4, sampler=DistributedSampler(DATA, num_replicas=1, rank=0))
    callback, model = DoctorCallback(guard=False), Regressor()
    for _ in range(2):
        make_trainer(callback, max_epochs=1).fit(model, loader)
    assert callback.findings == []


def test_audits_off() -> None:
    model = Regressor()
    add_hook_to_module(model.layer, AlignDevicesHook(execution_device="cpu"))
    callback = DoctorCallback(guard=False, audits=False)
    make_trainer(callback).fit(model, DataLoader(DATA, batch_size=4))
    assert callback.findings == []


# ------------------------------------------------------------------------------ fresh processes


def run_python(
    code: str, tmp_path: Path, timeout: float = 90, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `code` in its own process group; kill the whole group if it outlives `timeout`."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(code))
    full_env = {
        k: v for k, v in os.environ.items()
        if k == TOKEN_VARIABLE or not k.startswith(("DDPDOCTOR_", "MASTER_", "LOCAL_RANK"))
    }
    # MASTER_PORT from this lane's ports: Lightning's own pick is an ephemeral port another lane may take
    full_env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COLUMNS="200", MASTER_PORT=str(free_port()),
                    **env)
    return run_in_session([sys.executable, str(script)], timeout=timeout, env=full_env, cwd=tmp_path)


PREAMBLE = """
import json, os, torch
import lightning.pytorch as pl
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from ddpdoctor.lightning import DoctorCallback

class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

DATA = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
"""


def test_two_rank_ddp_shuffling_without_distributed_sampler(tmp_path: Path) -> None:
    """Real DDP (Lightning launches rank 1), guard installed by the callback on every rank:
    `use_distributed_sampler=False` + `shuffle=True` means ranks do not split the data. The guard's own
    loader audits (installed with it) find it at the loader's first `iter()`; the callback leaves loaders
    to them rather than say it twice."""
    result = run_python(
        PREAMBLE
        + """
callback = DoctorCallback(hang_after=60)
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, callbacks=[callback],
                     use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Regressor(), DataLoader(DATA, batch_size=4, shuffle=True))
import ddpdoctor.guard
assert callback.guard_installed and ddpdoctor.guard.is_installed()
assert callback.findings == []
with open(f"rank{trainer.global_rank}.json", "w") as out:
    json.dump([f.to_dict() for f in ddpdoctor.guard.current_runtime().findings], out)
""",
        tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout
    per_rank = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    for findings in per_rank.values():
        assert [f["class"] for f in findings] == ["sampler-epoch"]
        assert findings[0]["facts"]["world_size"] == 2
    # One line in each rank that found it
    for rank in (0, 1):
        assert result.stdout.count(f"[ddpdoctor] warning: [sampler-epoch] (rank {rank}) the dataloader") == 1


def test_callback_alone_turns_the_is_global_zero_sync_hang_into_a_report(tmp_path: Path) -> None:
    """No `ddpdoctor run`: only `callbacks=[DoctorCallback(...)]`. A metric synced under `is_global_zero`
    must end in one report naming the metric and its line, long before the 60 s process group timeout."""
    code = PREAMBLE + """
from datetime import timedelta
from lightning.pytorch.strategies import DDPStrategy

class Broken(Regressor):
    def validation_step(self, batch, batch_idx):
        pass
    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            self.log("val_metric", torch.tensor(1.0), sync_dist=True)

trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=60)),
                     max_epochs=2, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[DoctorCallback(hang_after=5, report_dir="report")])
trainer.fit(Broken(), DataLoader(DATA, batch_size=4), DataLoader(DATA, batch_size=4))
"""
    started = time.monotonic()
    result = run_python(code, tmp_path, timeout=90)
    assert result.returncode != 0, result.stdout[-3000:]
    assert time.monotonic() - started < 50, "waited for the process group timeout instead"
    assert result.stdout.count("ddpdoctor: collective-divergence") == 1, result.stdout[-3000:]
    findings = json.loads((tmp_path / "report" / "report.json").read_text())
    assert findings[0]["class"] == "collective-divergence"
    assert "metric `val_metric`, logged with sync_dist=True at" in findings[0]["message"]
    assert "job.py:" in findings[0]["message"] and "on_validation_epoch_end" in findings[0]["message"]


@pytest.mark.parametrize(
    ("blocked", "expected"),
    [
        (["lightning"], "pytorch_lightning"),
        (["lightning", "pytorch_lightning"], "ImportError: ddpdoctor.lightning needs Lightning"),
    ],
)
def test_module_imports_with_either_lightning_package(
    tmp_path: Path, blocked: list[str], expected: str
) -> None:
    # `sys.modules[name] = None` is how Python spells "not installed" for the import system.
    result = run_python(
        f"""
import sys
for name in {blocked!r}:
    sys.modules[name] = None
try:
    from ddpdoctor.lightning import DoctorCallback
except ImportError as exc:
    print(f"ImportError: {{exc}}")
else:
    print("base", DoctorCallback.__mro__[1].__module__.split(".")[0])
""",
        tmp_path,
        timeout=60,
    )
    assert expected in result.stdout, result.stdout
