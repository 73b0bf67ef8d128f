"""replica-divergence (F12) at run time: replicas compared at the wrap (layouts) and on schedule (digests).

The judgement on hand-made layouts and digests, and two real 2-rank DDP jobs under `ddpdoctor run`: one whose
`no_sync()` wraps every micro-batch (it ends with exit 0 and a warning naming a parameter), one whose ranks
size the model from their own data (named before DDP's own check). The correct accumulation runs clean in
the example tests (examples/replica-divergence/fixed.py, guarded in the demo)."""

from __future__ import annotations

from pathlib import Path

import pytest
from guard_jobs import fixture_line, guarded, report_of, run_job, run_passing_job, torchrun

from ddpdoctor.audits.replica_state import Digest, Layout, differing_parameters, layout_difference

SCRIPT = "replicas.py"


def test_the_first_differing_parameter_is_named() -> None:
    a = Layout(("w", "b", "head"), ((4, 2), (4,), (5, 4)), ("torch.float32",) * 3)
    assert layout_difference(a, a) is None
    wider = Layout(("w", "b", "head"), ((4, 2), (4,), (6, 4)), ("torch.float32",) * 3)
    assert layout_difference(wider, a) == (
        2, "parameter `head` (#2) is [6, 4] float32 here, [5, 4] float32 there"
    )
    shorter = Layout(("w", "b"), ((4, 2), (4,)), ("torch.float32",) * 2)
    assert layout_difference(shorter, a) == (2, "parameter `head` (#2) exists on one rank only")
    same = Digest(8, ("w", "b"), (1.0, 2.0, 0.5, 0.5))
    assert differing_parameters(same, same) == []
    assert differing_parameters(same, Digest(8, ("w", "b"), (1.0, 2.0, 0.5, 0.75))) == ["b"]


@pytest.fixture(scope="module")
def never_synced(tmp_path_factory: pytest.TempPathFactory):
    report = tmp_path_factory.mktemp("never-synced")
    result = run_passing_job(guarded(*torchrun(SCRIPT, "never-synced"), report=report), timeout=90)
    return result, report_of(report)


def test_replicas_that_never_sync_end_cleanly_with_a_warning(never_synced) -> None:
    result, findings = never_synced
    assert result.returncode == 0, result.output[-3000:]
    assert [f.class_ for f in findings] == ["replica-divergence"]
    finding = findings[0]
    assert finding.severity.value == "warning"
    assert finding.facts["parameter"] == "0.weight" and finding.facts["ranks"] == [0, 1]
    assert "before forward pass #8" in finding.message  # the first digest after the first optimizer step
    assert finding.location is not None and finding.location.line == fixture_line(SCRIPT, "wrap")
    assert "warning [replica-divergence]" in result.output and "parameter `0.weight`" in result.output


def test_models_built_differently_are_named_before_the_wrap_fails(tmp_path: Path) -> None:
    result = run_job(guarded(*torchrun(SCRIPT, "layout"), report=tmp_path), timeout=90)
    assert result.returncode != 0
    finding = next(f for f in report_of(tmp_path) if f.class_ == "replica-divergence")
    assert finding.message.startswith(
        "rank 1's model is not rank 0's when DistributedDataParallel wraps it (replicas.py:"
        f"{fixture_line(SCRIPT, 'wrap')}): parameter `2.weight` (#2) is [6, 16] float32 on rank 1, [5, 16] "
        "float32 on rank 0"
    )
    # said before DDP's own check, which names only the index
    assert result.output.index("[ddpdoctor] error (rank 1)") < result.output.index("appears not to match")
