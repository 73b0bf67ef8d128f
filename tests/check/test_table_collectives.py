"""Ops the checker knew only after its collectives came from the shared table (`ddpdoctor.collectives`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

RANK_ZERO_CALL = """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
out = torch.empty(8, device="cuda")
piece = torch.ones(4, device="cuda")
if dist.get_rank() == 0:
    dist.{op}(out, piece)
"""


@pytest.mark.parametrize("op", ["all_gather_single", "reduce_scatter_single", "all_gather_into_tensor"])
def test_a_collective_of_the_table_under_a_rank_test_is_reported(check, tmp_path: Path, op: str):
    script = tmp_path / "train.py"
    script.write_text(RANK_ZERO_CALL.format(op=op), encoding="utf-8")
    outcome = check(str(script), "--isolated", "--format", "json", "--no-progress")
    assert [(f["code"], f["line"]) for f in outcome.findings] == [("DDP101", 8)]


def test_a_cpu_tensor_into_a_single_form_collective_on_nccl_is_reported(check, tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import torch.distributed as dist

        dist.init_process_group("nccl")
        out = torch.empty(8, device="cuda")
        dist.all_gather_single(out, torch.ones(4))
    """), encoding="utf-8")
    outcome = check(str(script), "--isolated", "--format", "json", "--no-progress")
    assert [(f["code"], f["line"]) for f in outcome.findings] == [("DDP301", 6)]
