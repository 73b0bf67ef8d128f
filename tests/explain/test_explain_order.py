"""The first failure by order: the earliest failure of a log is the root-cause candidate, the timeouts after
it are its consequences (explain/order.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.explain import LogSource, explain_logs, knowledge_base
from ddpdoctor.explain.order import Moment, Role, role, timestamp


def _watchdog(rank: int, time: str) -> str:
    return (
        f"[rank{rank}]:[E1122 {time} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
        "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
    )


# a rank dies of its own config check, printed without a rank prefix (a launcher that adds none): the
# catalogue has no class for it; ranks 0 and 2 then time out in the next all-reduce, waiting for it
_RANK1_DIES = (
    "Traceback (most recent call last):\n"
    '  File "/job/train.py", line 51, in <module>\n'
    "    check_shard(cfg)\n"
    '  File "/job/train.py", line 20, in check_shard\n'
    "    raise ValueError(f'shard {cfg.shard} has no samples')\n"
    "ValueError: shard 1 has no samples\n"
)
_TIMEOUTS = _watchdog(0, "10:24:44.903881913") + _watchdog(2, "10:24:44.911057129")


def _explain(tmp_path: Path, text: str):
    path = tmp_path / "job.log"
    path.write_text(text, encoding="utf-8")
    return explain_logs([LogSource.from_arg(str(path))], knowledge_base()).diagnoses


def test_the_first_failure_is_the_root_and_the_later_timeouts_its_consequences(tmp_path: Path) -> None:
    # (before: the timeout alone, "the culprit is among rank 1", and nothing about the error)
    diagnoses = _explain(tmp_path, "[rank0]: step 40 loss 0.31\n" + _RANK1_DIES + _TIMEOUTS)
    first, timeout = diagnoses[0], next(d for d in diagnoses if d.slug == "collective-timeout")
    assert first.slug == "distributed-error"  # the root-cause candidate leads, its consequences follow
    assert first.finding.facts["exception"] == "ValueError"
    assert first.finding.facts["first_error"] == "ValueError: shard 1 has no samples"
    assert (timeout.finding.confidence or 0) < (first.finding.confidence or 0)
    assert timeout.finding.facts["silent_ranks"] == [1]
    assert any("after the job's first failure (line 7)" in s for s in timeout.explanation)


def test_a_failure_after_the_timeouts_is_not_their_root(tmp_path: Path) -> None:
    # the same error printed after the others had already timed out: not known to have caused them
    diagnoses = _explain(tmp_path, "[rank0]: step 40 loss 0.31\n" + _TIMEOUTS + _RANK1_DIES)
    assert diagnoses[0].slug == "collective-timeout"
    assert "distributed-error" not in [d.slug for d in diagnoses]


def test_a_caught_error_is_not_the_root_of_later_timeouts(tmp_path: Path) -> None:
    # rank 1 logs the error and carries on: it did not die of it
    survived = _RANK1_DIES + "skipping shard 1, step 41\n"
    diagnoses = _explain(tmp_path, survived + _TIMEOUTS)
    assert diagnoses[0].slug == "collective-timeout"
    assert "distributed-error" not in [d.slug for d in diagnoses]


@pytest.mark.parametrize(
    ("line", "time"),
    [
        ("[rank0]:[E1122 10:24:44.903881913 ProcessGroupNCCL.cpp:616] x", (11, 22, 10, 24, 44, 903881)),
        ("W1122 10:24:46.112000 4101 torch/distributed/elastic/api.py:897] x", (11, 22, 10, 24, 46, 112000)),
        ("2024-11-22 10:14:02,120 - ERROR - x", (11, 22, 10, 14, 2, 120000)),
        ("RuntimeError: no time here", None),
    ],
)
def test_timestamp(line: str, time: tuple[int, ...] | None) -> None:
    assert timestamp(line) == time


def test_times_decide_before_lines_and_logs() -> None:
    early, late = (11, 22, 10, 0, 0, 0), (11, 22, 10, 5, 0, 0)
    # a later line of another rank's file that says it was written first
    assert Moment("rank1.log", 900, early).before(Moment("rank0.log", 3, late))
    assert not Moment("rank0.log", 3, late).before(Moment("rank1.log", 900, early))
    # without times: lines of one log by order, lines of two logs not ordered
    assert Moment("job.log", 3).before(Moment("job.log", 9))
    assert not Moment("a.log", 3).before(Moment("b.log", 9))
    root = Moment("job.log", 3)
    assert role(root, root) is Role.ROOT
    assert role(Moment("job.log", 9), root) is Role.CONSEQUENCE
    assert role(Moment("other.log", 9), root) is Role.UNORDERED
