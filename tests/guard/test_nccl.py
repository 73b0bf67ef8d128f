"""F1 against real NCCL: what `backend="cuda:gloo"` reproduces on a CPU machine, checked on a GPU machine
with the real backend. Skipped where torch sees no CUDA device or has no NCCL (CI has neither); run with
`python -m pytest tests/guard/test_nccl.py` on a GPU machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from guard_jobs import FIXTURES, PYTHON, fixture_line, guarded, job_env, run_job, torchrun

from ddpdoctor.findings import loads

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(
    not GPUS or not dist.is_nccl_available(), reason="needs a CUDA device and NCCL"
)


def test_unguarded_cpu_tensor_on_nccl_fails_with_torch_message() -> None:
    """The ground truth the guard replaces: torch's own error, with no tensor, group or line in it."""
    result = run_job(torchrun("nccl_device.py", "broken", nproc=2), timeout=90)
    assert result.returncode != 0
    assert "No backend type associated with device type cpu" in result.output


def test_guard_names_tensor_group_and_line_on_nccl(tmp_path: Path) -> None:
    # Two ranks even on one GPU: the check runs before NCCL builds a communicator.
    result = run_job(guarded(*torchrun("nccl_device.py", "broken", nproc=2), report=tmp_path), timeout=90)
    assert result.returncode == 1, result.output[-3000:]
    assert (
        "tensor of shape [2] dtype float32 on cpu, but process group '0' (nccl) has backends only for cuda"
        in result.output
    )
    finding = loads((tmp_path / "report.json").read_text())[0]
    assert finding.class_ == "backend-device-mismatch"
    assert finding.location is not None and finding.location.path.endswith("nccl_device.py")
    assert finding.location.line == fixture_line("nccl_device.py", "cpu-tensor")


def test_remedy_runs_the_collective_on_the_gpu(tmp_path: Path) -> None:
    nproc = min(2, GPUS)  # NCCL needs one GPU per rank once it communicates
    result = run_job(
        guarded(*torchrun("nccl_device.py", "broken", nproc=nproc), report=tmp_path, remedy=True), timeout=120
    )
    assert result.returncode == 0, result.output[-3000:]
    expected = [float(sum(range(1, nproc + 1)) * nproc), 10.0 * nproc**2]  # two SUM all_reduces
    for rank in range(nproc):
        assert f"rank {rank}: result {expected} on cpu" in result.output, result.output[-3000:]
    assert result.output.count("[ddpdoctor] remedy:") == nproc


def test_remedy_brings_back_an_in_place_result_not_the_input_over_it(tmp_path: Path) -> None:
    nproc = min(2, GPUS)
    result = run_job(
        guarded(*torchrun("nccl_device.py", "in-place", nproc=nproc), report=tmp_path, remedy=True),
        timeout=120,
    )
    assert result.returncode == 0, result.output[-3000:]
    for rank in range(nproc):
        line = next(text for text in result.output.splitlines() if text.startswith(f"rank {rank}: in-place"))
        got, rest = line.split(": in-place ")[1].split(" expected ")
        expected, native = rest.split(" native ")
        assert got == native, line  # the remedy gives what NCCL gives for the call on GPU tensors
        if nproc > 1:
            assert got == expected, line


def test_fixed_form_is_clean_on_nccl(tmp_path: Path) -> None:
    nproc = min(2, GPUS)
    result = run_job(guarded(*torchrun("nccl_device.py", "fixed", nproc=nproc), report=tmp_path), timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert loads((tmp_path / "report.json").read_text()) == []


@pytest.mark.parametrize("mode", ["broken", "fixed"])
def test_lightning_cpu_metric_on_nccl(tmp_path: Path, mode: str) -> None:
    """A CPU-computed metric logged with sync_dist=True under strategy="ddp" on a GPU: without the guard
    torch's bare error; under it, a report naming the metric and its `self.log` line."""
    fixture = str(FIXTURES / "nccl_lightning.py")
    bare = run_job([PYTHON, fixture, mode], timeout=180, env=job_env(), cwd=str(tmp_path))
    result = run_job(
        guarded(PYTHON, fixture, mode, report=tmp_path / "report"), timeout=180, cwd=str(tmp_path)
    )
    if mode == "fixed":
        assert bare.returncode == 0 and result.returncode == 0, result.output[-3000:]
        assert "rank 0: fit done" in result.output
        return
    assert bare.returncode != 0 and "No backend type associated with device type cpu" in bare.output, (
        bare.output[-3000:]
    )
    assert result.returncode == 1, result.output[-3000:]
    finding = loads((tmp_path / "report" / "report.json").read_text())[0]
    assert finding.class_ == "backend-device-mismatch"
    assert "for metric `cpu_score`, logged with sync_dist=True at" in finding.message
    assert finding.locations[0].path.endswith("nccl_lightning.py")
    assert finding.locations[0].line == fixture_line("nccl_lightning.py", "log")


def test_queued_nccl_collective_is_tracked_until_the_gpu_ran_it(tmp_path: Path) -> None:
    """The all_reduce returns at once and sits behind GPU work: the guard keeps it pending (an event
    behind it on the stream), marks it done once the GPU passes it, and reports nothing."""
    result = run_job(guarded(*torchrun("nccl_pending.py", "clean", nproc=1), report=tmp_path, hang_after=30),
                     timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert "rank 0: result 4.0" in result.output
    assert loads((tmp_path / "report.json").read_text()) == []
    records = [json.loads(line) for line in (tmp_path / "job-1" / "rank-0.jsonl").read_text().splitlines()]
    assert [r["op"] for r in records][-3:] == ["all_reduce", "all_reduce", "barrier"]
    assert all(r["state"] == "done" for r in records), records


@pytest.mark.skipif(GPUS < 2, reason="a 2-rank NCCL hang needs 2 GPUs")
def test_rank_conditional_nccl_all_reduce_is_reported_while_the_host_blocks_elsewhere(tmp_path: Path) -> None:
    result = run_job(guarded(*torchrun("nccl_pending.py", "rank-conditional", nproc=2), report=tmp_path,
                             hang_after=5), timeout=120)
    assert result.returncode == 1, result.output[-3000:]
    finding = loads((tmp_path / "report.json").read_text())[0]
    assert finding.class_ == "collective-timeout", result.output[-3000:]
    line = fixture_line("nccl_pending.py", "rank-conditional")
    assert "rank 0 has waited" in finding.message
    assert f"in all_reduce(SUM) [4] float32 at nccl_pending.py:{line}" in finding.message
    assert "rank 1 is running, not in a collective" in finding.message
