"""`audit_loader`, `EpochWatch` and `audit_default_device` on real DataLoaders and samplers."""

from __future__ import annotations

import pytest
import torch
from samplers import BucketSampler
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

import ddpdoctor
from ddpdoctor.audits import EpochWatch, audit_default_device, audit_loader, iter_loaders
from ddpdoctor.findings import Severity

DATA = TensorDataset(torch.arange(32.0).unsqueeze(1))


def _non_cpu_generator() -> torch.Generator | None:
    for device in ("cuda", "xpu", "mps"):
        try:
            return torch.Generator(device=device)
        except RuntimeError:
            continue
    return None


# ------------------------------------------------------------------------------------ generators (F2)


def test_cpu_generators_are_fine() -> None:
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(DATA, batch_size=4, shuffle=True, generator=generator)
    assert audit_loader(loader) == []
    sampler_loader = DataLoader(DATA, sampler=RandomSampler(DATA, generator=generator))
    assert audit_loader(sampler_loader) == []


@pytest.mark.parametrize("where", ["generator", "sampler.generator"])
def test_generator_on_an_accelerator_is_reported(where: str) -> None:
    generator = _non_cpu_generator()
    if generator is None:
        pytest.skip("this torch build cannot create a generator on any non-CPU device (CPU-only machine)")
    if where == "generator":
        loader = DataLoader(DATA, batch_size=4, generator=generator)
    else:
        loader = DataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=generator))

    (finding,) = audit_loader(loader, name="train dataloader")

    assert finding.class_ == "init-module-scope"
    assert finding.facts["attribute"] == where
    assert f"`{where}`" in finding.message


# --------------------------------------------------------------------------- sharding and epochs (F7)


def test_shuffling_without_a_distributed_sampler_in_a_multi_rank_job() -> None:
    loader = DataLoader(DATA, batch_size=4, shuffle=True)

    (finding,) = audit_loader(loader, name="train dataloader", world_size=2)

    assert finding.class_ == "sampler-epoch"
    assert "2-rank job" in finding.message
    assert finding.facts["sampler"] == "sampler"


def test_sharded_unshuffled_or_single_rank_loaders_are_fine() -> None:
    sharded = DataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=2, rank=0))
    assert audit_loader(sharded, world_size=2) == []
    assert audit_loader(DataLoader(DATA, shuffle=False), world_size=2) == []
    assert audit_loader(DataLoader(DATA, shuffle=True), world_size=1) == []


def test_world_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert [f.facts["world_size"] for f in ddpdoctor.audit_loader(DataLoader(DATA, shuffle=True))] == [4]


def test_collections_of_loaders_are_named() -> None:
    loaders = {"a": DataLoader(DATA, shuffle=True), "b": [DataLoader(DATA), DataLoader(DATA, shuffle=True)]}
    assert [name for name, _ in iter_loaders(loaders, "train")] == [
        "train['a']",
        "train['b'][0]",
        "train['b'][1]",
    ]
    findings = audit_loader(loaders, name="train", world_size=2)
    assert [f.facts["loader"] for f in findings] == ["train['a']", "train['b'][1]"]


def _epochs(loader: DataLoader, watch: EpochWatch, epochs: int, set_epoch: bool) -> list[list[float]]:
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        watch.observe(loader)
        orders.append([x.item() for (batch,) in loader for x in batch])
    return orders


def test_epoch_watch_reports_a_sampler_whose_epoch_never_changes() -> None:
    loader = DataLoader(DATA, batch_size=4, sampler=DistributedSampler(DATA, num_replicas=2, rank=0, seed=1))
    watch = EpochWatch()

    orders = _epochs(loader, watch, epochs=3, set_epoch=False)

    assert orders[0] == orders[1] == orders[2]  # the bug: the same order every epoch
    (finding,) = watch.findings  # reported once, at the second epoch
    assert finding.class_ == "sampler-epoch"
    assert finding.severity is Severity.WARNING
    assert "still at epoch 0" in finding.message
    assert "nested deeper" not in finding.message


def test_epoch_watch_is_silent_when_set_epoch_is_called() -> None:
    loader = DataLoader(DATA, batch_size=4, sampler=DistributedSampler(DATA, num_replicas=2, rank=0, seed=1))
    watch = EpochWatch()

    orders = _epochs(loader, watch, epochs=3, set_epoch=True)

    assert orders[0] != orders[1]
    assert watch.findings == []


def test_epoch_watch_finds_a_nested_distributed_sampler() -> None:
    loader = DataLoader(DATA, sampler=BucketSampler(DistributedSampler(DATA, num_replicas=2, rank=0)))
    watch = EpochWatch()
    watch.observe(loader)
    (finding,) = watch.observe(loader)
    assert finding.facts["sampler"] == "sampler.base_sampler"
    assert "forward `set_epoch`" in finding.message


# -------------------------------------------------------------------------------- default device (F2)


def test_no_default_device_context() -> None:
    assert audit_default_device() == []


def test_fit_inside_a_device_context_on_an_accelerator_is_an_error() -> None:
    with torch.device("meta"):
        (finding,) = audit_default_device("trainer.fit")
        # What the finding predicts: the sampler's draw lands on that device and cannot be read back.
        with pytest.raises((RuntimeError, NotImplementedError)):
            list(DistributedSampler(DATA, num_replicas=2, rank=0))
    assert finding.class_ == "init-module-scope"
    assert finding.severity is Severity.ERROR
    assert finding.facts == {"default_device": "meta", "scoped": True}
    assert "init_module()" in finding.message


def test_fit_inside_a_cpu_device_context_is_a_warning() -> None:
    with torch.device("cpu"):
        (finding,) = audit_default_device()
    assert finding.severity is Severity.WARNING
    assert "on GPUs" in finding.message


def test_global_default_device() -> None:
    try:
        torch.set_default_device("meta")
        (finding,) = audit_default_device()
        torch.set_default_device("cpu")
        assert audit_default_device() == []
    finally:
        torch.set_default_device(None)
    assert finding.facts == {"default_device": "meta", "scoped": False}
    assert "set_default_device" in finding.message
    assert audit_default_device() == []
