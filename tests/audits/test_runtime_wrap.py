"""F3 foreign-device-hooks at the wrap under `ddpdoctor run` with no code change: DDP under torchrun (the
finding is out before DDP's own constructor raises), Lightning's DDP strategy under `python`, and
`accelerator.prepare` under `accelerate launch`, on the same jobs as test_runtime_checkpoints."""

from __future__ import annotations

import pytest
from runtime_jobs import line_of, run

from ddpdoctor.findings import Severity


def test_ddp_of_a_module_left_on_meta_is_named_before_ddp_raises() -> None:
    job = run("torch", "broken")
    assert job.returncode != 0
    [finding] = job.of_class("foreign-device-hooks")
    assert finding.severity is Severity.ERROR
    assert finding.facts["module"] == "3" and finding.facts["device"] == "meta"
    assert finding.facts["wrapped_by"] == "DistributedDataParallel"
    assert (str(job.script), line_of(job.script, "wrap")) in {(loc.path, loc.line) for loc in finding.locations}
    # said before DDP's constructor raised, in each rank that found it
    for rank in (0, 1):
        said = job.output.index(f"[ddpdoctor] warning (rank {rank}): `3`")
        assert said < job.output.index("input module must be on the same type of devices")


@pytest.mark.parametrize(("framework", "wrapper", "marker"), [
    ("lightning", "DistributedDataParallel", "fit"),
    ("accelerate", "accelerator.prepare", "prepare"),
])
def test_accelerate_hooks_sending_inputs_elsewhere_are_named_at_the_wrap(framework: str, wrapper: str, marker: str) -> None:
    job = run(framework, "broken")
    [finding] = job.of_class("foreign-device-hooks")  # once, though each rank (and DDP after prepare) audits it
    assert finding.severity is Severity.ERROR
    assert finding.facts["foreign_devices"] == ["meta"]
    assert [hook["hook"] for hook in finding.facts["hooks"]] == ["AlignDevicesHook(execution_device=meta)"]
    assert finding.facts["wrapped_by"] == wrapper
    lines = {(loc.path, loc.line) for loc in finding.locations}
    assert (str(job.script), line_of(job.script, marker)) in lines
    if framework == "lightning":  # the LightningModule's class is where the hook was attached
        assert (str(job.script), line_of(job.script, "model class")) in lines


@pytest.mark.parametrize("framework", ["torch", "lightning", "accelerate"])
def test_hooks_on_the_rank_device_and_a_materialised_model_are_fine(framework: str) -> None:
    job = run(framework, "fixed")
    assert job.returncode == 0, job.output[-3000:]
    assert job.of_class("foreign-device-hooks") == []
