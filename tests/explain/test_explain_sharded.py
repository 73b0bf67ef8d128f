"""FSDP's hidden collectives in NCCL timeout logs (explain/sharded.py): ranks that time out at different
positions, one of them in `_ALLGATHER_BASE` / `_REDUCE_SCATTER_BASE`, ran a different number of forward or
backward passes of a sharded model; at one position such a timeout is only a timeout."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.explain import explain_paths

FIXTURES = Path(__file__).parent / "fixtures"


def _classes(name: str) -> list[tuple[str, float]]:
    explanation = explain_paths([str(FIXTURES / name)])
    return [(d.finding.class_, d.finding.confidence or 0.0) for d in explanation.diagnoses]


def test_ranks_at_different_positions_in_fsdp_collectives_ran_different_passes() -> None:
    explanation = explain_paths([str(FIXTURES / "nccl_fsdp_allgather_positions.log")])
    best = explanation.diagnoses[0]
    assert best.finding.class_ == "sharded-step-divergence"
    assert best.finding.facts["positions"] == {
        "0": {"seq_num": 2431, "op_type": "_ALLGATHER_BASE"}, "1": {"seq_num": 2431, "op_type": "ALLREDUCE"},
    }
    assert best.explanation[0].startswith(
        "The ranks that timed out wait at different collectives (rank 0 in _ALLGATHER_BASE #2431, rank 1 in "
        "ALLREDUCE #2431), and rank 0 waits in a sharded model's own collective"
    )
    # one diagnosis of the class: the data's reading of the same line gave way to the positions'
    assert [c for c, _ in _classes("nccl_fsdp_allgather_positions.log")].count("sharded-step-divergence") == 1


def test_a_timeout_in_an_fsdp_collective_at_one_position_is_a_timeout_first() -> None:
    classes = _classes("nccl_fsdp_allgather_same.log")
    assert classes[0][0] == "collective-timeout"
    assert ("sharded-step-divergence", 0.5) in classes
