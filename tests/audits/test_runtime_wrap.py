"""F3 foreign-device-hooks at the wrap under `ddpdoctor run` with no code change: DDP under torchrun (the
finding is out before DDP's own constructor raises), Lightning's DDP strategy under `python`, and
`accelerator.prepare` under `accelerate launch`, on the same jobs as test_runtime_checkpoints."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from runtime_jobs import LANE, line_of, run
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

# imported before the audit is installed, as a program imports them before init_process_group (the patch
# is on FSDP's class and on the global `fully_shard` calls, so these names see it)
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.audits.wrapping import install_wrap_audit
from ddpdoctor.findings import Finding, Severity

pytestmark = pytest.mark.xdist_group(LANE)


def test_ddp_of_a_module_left_on_meta_is_named_before_ddp_raises() -> None:
    job = run("torch", "broken")
    assert job.returncode != 0
    [finding] = job.of_class("foreign-device-hooks")
    assert finding.severity is Severity.ERROR
    assert finding.facts["module"] == "3" and finding.facts["device"] == "meta"
    assert finding.facts["wrapped_by"] == "DistributedDataParallel"
    assert (str(job.script), line_of(job.script, "wrap")) in {
        (loc.path, loc.line) for loc in finding.locations
    }
    # said before DDP's constructor raised, in each rank that found it
    for rank in (0, 1):
        said = job.output.index(f"[ddpdoctor] warning (rank {rank}): `3`")
        assert said < job.output.index("input module must be on the same type of devices")


@pytest.mark.parametrize(("framework", "wrapper", "marker"), [
    ("lightning", "DistributedDataParallel", "fit"),
    ("accelerate", "accelerator.prepare", "prepare"),
])
def test_accelerate_hooks_sending_inputs_elsewhere_are_named_at_the_wrap(
    framework: str, wrapper: str, marker: str
) -> None:
    job = run(framework, "broken")
    # once, though each rank (and DDP after prepare) audits it
    [finding] = job.of_class("foreign-device-hooks")
    assert finding.severity is Severity.ERROR
    assert finding.facts["foreign_devices"] == ["meta"]
    assert [hook["hook"] for hook in finding.facts["hooks"]] == ["AlignDevicesHook(execution_device=meta)"]
    assert finding.facts["wrapped_by"] == wrapper
    lines = {(loc.path, loc.line) for loc in finding.locations}
    assert (str(job.script), line_of(job.script, marker)) in lines
    if framework == "lightning":  # the LightningModule's class is where the hook was attached
        assert (str(job.script), line_of(job.script, "model class")) in lines


@pytest.mark.parametrize("how", ["run", "install", "callback"])
def test_the_lightning_jobs_hook_is_named_the_same_whichever_way_the_guard_got_in(how: str) -> None:
    """`ddpdoctor run` with nothing in the program, `ddpdoctor.install()` in it, or `DoctorCallback`: the same
    job (its submodule's AlignDevicesHook sends inputs to meta) gives the same F3 finding in report.json."""
    job = run("lightning", "broken", how)
    [finding] = job.of_class("foreign-device-hooks")
    assert finding.severity is Severity.ERROR, job.output[-3000:]
    assert finding.facts["wrapped_by"] == "DistributedDataParallel", finding.facts
    assert finding.facts["foreign_devices"] == ["meta"]
    assert [hook["hook"] for hook in finding.facts["hooks"]] == ["AlignDevicesHook(execution_device=meta)"]
    lines = {(loc.path, loc.line) for loc in finding.locations}
    assert (str(job.script), line_of(job.script, "model class")) in lines


@pytest.mark.parametrize("framework", ["torch", "lightning", "accelerate"])
def test_hooks_on_the_rank_device_and_a_materialised_model_are_fine(framework: str) -> None:
    job = run(framework, "fixed")
    assert job.returncode == 0, job.output[-3000:]
    assert job.of_class("foreign-device-hooks") == []


# ------------------------------------------------------------------- in one process, a group of one rank


@pytest.fixture
def wrap_findings() -> Iterator[list[Finding]]:
    """The wrap audit installed as the guard installs it, in a one-rank gloo group; its findings."""
    import accelerate.accelerator  # noqa: F401 - imported before the install, as a program has it

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    found: list[Finding] = []
    remove = install_wrap_audit(found.append)
    try:
        yield found
    finally:
        remove()
        dist.destroy_process_group()


def _hooked_elsewhere() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    add_hook_to_module(model[1], AlignDevicesHook(execution_device="cpu"))
    model[1]._hf_hook.execution_device = torch.device("meta")  # weights here, inputs sent elsewhere
    return model


def test_the_finding_is_kept_before_ddp_raises(wrap_findings: list[Finding]) -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    with torch.device("meta"):
        model.append(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="same type of devices"):
        DistributedDataParallel(model)
    assert [f.facts["module"] for f in wrap_findings] == ["1"]


def test_fully_shard_called_per_block_reports_the_hooks_once(wrap_findings: list[Finding]) -> None:
    model = _hooked_elsewhere()
    mesh = init_device_mesh("cpu", (1,))
    for module in (model[0], model[1], model):
        fully_shard(module, mesh=mesh)
    [finding] = wrap_findings
    assert finding.facts["wrapped_by"] == "fully_shard"
    assert finding.facts["foreign_devices"] == ["meta"]


def test_prepare_names_a_device_map_off_the_rank_device(wrap_findings: list[Finding]) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model.hf_device_map = {"0": "cpu", "1": "disk"}  # what device_map="auto" with offload leaves
    try:
        Accelerator(cpu=True).prepare_model(model)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    [finding] = wrap_findings
    assert finding.facts["hf_device_map"] == {"1": "disk"}
    assert finding.facts["wrapped_by"] == "accelerator.prepare"


def test_uninstalling_puts_the_constructors_back() -> None:
    before = DistributedDataParallel.__dict__["__init__"]
    remove = install_wrap_audit(lambda finding: None)
    assert DistributedDataParallel.__dict__["__init__"] is not before
    remove()
    assert DistributedDataParallel.__dict__["__init__"] is before


def test_fsdp_auto_wrap_audits_the_root_not_each_block_again(wrap_findings: list[Finding]) -> None:
    with pytest.warns(UserWarning, match="NO_SHARD"):  # FSDP's own note on a one-rank group
        FullyShardedDataParallel(_hooked_elsewhere(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                                 device_id=torch.device("cpu"))
    [finding] = wrap_findings
    assert finding.facts["wrapped_by"] == "FullyShardedDataParallel"
    assert [hook["module"] for hook in finding.facts["hooks"]] == ["1"]
