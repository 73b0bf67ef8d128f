"""`audit_model` and `audit_forward` on real modules, with real accelerate hooks (CPU and the meta device).

Without a GPU, "the wrong device" is the meta device: accelerate's offload puts weights there, and a
module moved there is as foreign to a CPU rank as `cuda:0` is to rank 1.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from accelerate import cpu_offload, dispatch_model
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from torch import nn

import ddpdoctor
from ddpdoctor.audits import AuditWarning, audit_forward, audit_model
from ddpdoctor.audits.device_placement import MAX_GROUPS
from ddpdoctor.findings import Severity, dumps, loads


class Encoder(nn.Module):
    def __init__(self, layers: int = 20) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])
        self.head = nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x)) * self.scale


def test_model_on_one_device_has_no_findings() -> None:
    assert audit_model(Encoder(), device="cpu") == []


def test_misplaced_submodule_is_one_finding_naming_its_path() -> None:
    model = Encoder()
    model.blocks.to("meta")  # 40 tensors

    findings = audit_model(model, device="cpu")

    assert len(findings) == 1
    finding = findings[0]
    assert finding.class_ == "foreign-device-hooks"
    assert finding.severity is Severity.ERROR
    assert "`blocks`" in finding.message and "meta" in finding.message and "cpu" in finding.message
    assert finding.facts["module"] == "blocks"
    assert finding.facts["tensors"] == 40
    # The location is the user's class, not torch's Sequential.
    assert finding.location is not None and finding.location.path == __file__
    assert finding.location.line == Encoder.__init__.__code__.co_firstlineno - 1


def test_single_tensor_and_whole_submodule_are_separate_groups() -> None:
    model = Encoder()
    model.blocks[3].to("meta")
    model.head.bias = nn.Parameter(torch.zeros(2, device="meta"))

    modules = sorted(f.facts["module"] for f in audit_model(model, device="cpu"))

    assert modules == ["blocks.3", "head.bias"]


def test_scattered_tensors_are_grouped_not_listed_one_by_one() -> None:
    model = Encoder(layers=50)
    for block in model.blocks:
        block.bias = nn.Parameter(torch.zeros(4, device="meta"))

    findings = audit_model(model, device="cpu")

    assert 1 <= len(findings) <= MAX_GROUPS
    assert sum(f.facts.get("tensors", 0) for f in findings) == 50
    assert "under `blocks`" in findings[0].message


def test_default_device_outside_a_job_is_where_most_of_the_model_is(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOCAL_RANK", "RANK"):
        monkeypatch.delenv(name, raising=False)
    model = Encoder()
    model.head.to("meta")
    findings = ddpdoctor.audit_model(model)
    assert [f.facts["module"] for f in findings] == ["head"]

    # Inside a job the rank's device is the reference (CPU here: no CUDA), whatever the majority is.
    monkeypatch.setenv("LOCAL_RANK", "0")
    model = Encoder()
    model.blocks.to("meta")
    assert [f.facts["module"] for f in audit_model(model)] == ["blocks"]


def test_accelerate_hook_moving_to_another_device_is_an_error_naming_the_module() -> None:
    model = Encoder()
    add_hook_to_module(model.blocks[2], AlignDevicesHook(execution_device="meta"))

    findings = audit_model(model, device="cpu")

    assert [f.class_ for f in findings] == ["foreign-device-hooks"]
    finding = findings[0]
    assert finding.severity is Severity.ERROR
    assert "`blocks.2`" in finding.evidence[0].text
    assert "AlignDevicesHook(execution_device=meta)" in finding.evidence[0].text
    assert finding.facts["foreign_devices"] == ["meta"]
    assert finding.fix is not None and 'device_map={"": local_rank}' in finding.fix.message


def test_accelerate_hook_on_the_rank_device_is_still_a_second_owner() -> None:
    model = Encoder()
    add_hook_to_module(model.head, AlignDevicesHook(execution_device="cpu"))

    (finding,) = audit_model(model, device="cpu")

    assert finding.class_ == "foreign-device-hooks"
    assert finding.severity is Severity.WARNING


def test_cpu_offload_is_reported_once_with_the_offloaded_tensors() -> None:
    model = Encoder()
    cpu_offload(model, execution_device="cpu")  # weights go to meta, come back at forward
    assert model.blocks[0].weight.device.type == "meta"

    findings = audit_model(model, device="cpu")

    assert len(findings) == 1  # not one hook finding plus 42 misplaced-tensor findings
    assert "offload=True" in " ".join(e.text for e in findings[0].evidence)
    assert "42 tensor(s)" in findings[0].message
    assert model(torch.ones(1, 4)).shape == (1, 2)  # the audit changed nothing


@pytest.mark.filterwarnings("ignore:The following device_map keys do not match")
def test_dispatch_model_device_map_is_reported() -> None:
    model = Encoder()
    # accelerate wants the root buffer in the map and then warns that it is not a submodule.
    dispatch_model(model, device_map={"blocks": "cpu", "head": "meta", "scale": "cpu"}, main_device="cpu")
    assert model.hf_device_map["head"] == "meta"

    (finding,) = audit_model(model, device="cpu")

    assert finding.severity is Severity.ERROR
    assert finding.facts["hf_device_map"] == {"head": "meta"}
    assert "hf_device_map" in finding.message


def test_device_map_on_the_rank_device_alone_is_fine() -> None:
    model = Encoder()
    dispatch_model(model, device_map={"": "cpu"})  # the documented fix: one device, the rank's
    assert model.hf_device_map == {"": "cpu"}

    assert audit_model(model, device="cpu") == []


class Linear8bitLt(nn.Linear):
    """Stand-in with the name and module of bitsandbytes' layer (bitsandbytes is not installed here);
    the audit recognises such layers by name and module, without importing bitsandbytes."""


Linear8bitLt.__module__ = "bitsandbytes.nn.modules"


def test_bitsandbytes_layers_are_listed() -> None:
    model = Encoder()
    model.head = Linear8bitLt(4, 2)

    (finding,) = audit_model(model, device="cpu")

    assert finding.class_ == "foreign-device-hooks"
    assert "Linear8bitLt x1" in finding.message
    assert finding.facts["modules"] == ["head"]


def test_findings_survive_json() -> None:
    model = Encoder()
    model.blocks.to("meta")
    add_hook_to_module(model.head, AlignDevicesHook(execution_device="meta"))
    findings = audit_model(model, device="cpu")
    assert loads(dumps(findings)) == findings


# ------------------------------------------------------------------------------------------ forward


def test_forward_check_names_the_first_module_whose_inputs_and_weights_disagree() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[2].to("meta")

    with audit_forward(model) as check, pytest.warns(AuditWarning, match="module `2`"):
        try:
            model(torch.ones(3, 4))
        except (RuntimeError, NotImplementedError):
            pass  # torch's own error follows the audit's

    (finding,) = check.findings
    assert finding.facts == {"module": "2", "input_device": "cpu", "weight_devices": ["meta"]}
    assert "[3, 4]" in finding.message


def test_forward_check_catches_inputs_an_accelerate_hook_moved() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    # accelerate sends the first layer's output to meta; the second layer's weights stay on the CPU.
    add_hook_to_module(model[0], AlignDevicesHook(execution_device="meta", io_same_device=False))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AuditWarning)
        with audit_forward(model) as check:
            try:
                model(torch.ones(1, 4))
            except (RuntimeError, NotImplementedError):
                pass

    assert [f.facts["module"] for f in check.findings] == ["1"]
    assert check.findings[0].facts["input_device"] == "meta"


def test_forward_check_is_silent_on_a_healthy_model_and_removes_its_hooks() -> None:
    model = Encoder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditWarning)
        with audit_forward(model) as check:
            model(torch.ones(2, 4))
    assert check.findings == []
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_device_ids_for_a_cpu_module_is_ddps_own_refusal_and_names_no_device_the_machine_lacks() -> None:
    """accelerate's GPU-only test script run on a CPU machine: DDP refuses `device_ids=[0]` for a CPU module.
    That is the failure to name, not a model "not on cuda:0" of an "NCCL group" the machine cannot have."""
    from ddpdoctor.audits.ddp_arguments import refused_device_ids

    finding = refused_device_ids(Encoder(), [0])
    assert finding is not None
    assert "DDP refuses device_ids for a CPU module" in finding.message
    assert "NCCL" not in finding.message
    if not torch.cuda.is_available():
        assert "this machine has no CUDA device" in finding.message
        assert "cuda:" not in finding.message + (finding.fix.message if finding.fix else "")
    assert refused_device_ids(Encoder(), None) is None
    assert refused_device_ids(Encoder().to("meta"), [0]) is None
