"""replica-divergence (F12) at run time: replicas compared at the wrap (layouts) and on schedule (digests).

The judgement on hand-made layouts and digests, and real 2-rank DDP jobs under `ddpdoctor run`: one whose
`no_sync()` wraps every micro-batch (it ends with exit 0 and a warning naming a parameter), one whose ranks
size the model from their own data (named before DDP's own check), and two that drift apart late, with the
pass schedule off: found on the clock (`--digest-every 1`), and after rank 0's checkpoint save. The correct
accumulation runs clean in the example tests (examples/replica-divergence/fixed.py, guarded in the demo)."""

from __future__ import annotations

from pathlib import Path

import pytest
from guard_jobs import fixture_line, guarded, job_env, ranks, report_of, run_job, run_passing_job

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
    result = run_passing_job(guarded(*ranks(SCRIPT, "never-synced"), report=report), timeout=90)
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
    result = run_job(guarded(*ranks(SCRIPT, "layout"), report=tmp_path), timeout=90)
    assert result.returncode != 0
    finding = next(f for f in report_of(tmp_path) if f.class_ == "replica-divergence")
    assert finding.message.startswith(
        "rank 1's model is not rank 0's when DistributedDataParallel wraps it (replicas.py:"
        f"{fixture_line(SCRIPT, 'wrap')}): parameter `2.weight` (#2) is [6, 16] float32 on rank 1, [5, 16] "
        "float32 on rank 0"
    )
    # said before DDP's own check, which names only the index
    assert result.output.index("[ddpdoctor] error (rank 1)") < result.output.index("appears not to match")


def _late_drift(report: Path, mode: str, every: str) -> tuple[object, list]:
    env = {**job_env(), "DDPDOCTOR_DIGEST_EVERY": "0"}  # no digest on the pass schedule: only the points
    command = guarded(*ranks(SCRIPT, mode), report=report)
    command[command.index("--"):command.index("--")] = ["--digest-every", every]
    result = run_passing_job(command, timeout=120, env=env)
    return result, report_of(report)


@pytest.fixture(scope="module")
def drift_on_the_clock(tmp_path_factory: pytest.TempPathFactory):
    return _late_drift(tmp_path_factory.mktemp("clock"), "late-drift", "1")


@pytest.fixture(scope="module")
def drift_after_a_save(tmp_path_factory: pytest.TempPathFactory):
    return _late_drift(tmp_path_factory.mktemp("save"), "late-drift-save", "0")


def test_replicas_are_compared_on_the_clock(drift_on_the_clock) -> None:
    result, findings = drift_on_the_clock
    assert result.returncode == 0, result.output[-3000:]
    assert [f.class_ for f in findings] == ["replica-divergence"]
    assert ", on the 1 s clock of the DistributedDataParallel model" in findings[0].message
    assert "at the end of the job" not in findings[0].message


def test_replicas_are_compared_after_a_checkpoint_save(drift_after_a_save) -> None:
    result, findings = drift_after_a_save
    assert result.returncode == 0, result.output[-3000:]
    assert [f.class_ for f in findings] == ["replica-divergence"]
    save = fixture_line(SCRIPT, "save")
    message = findings[0].message
    assert f", the first comparison after the checkpoint save at replicas.py:{save} of the" in message
