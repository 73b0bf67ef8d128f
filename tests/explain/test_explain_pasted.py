"""Logs as users paste them: cut at a terminal's width, lines labelled with their rank by the program itself,
errors outside the catalogue, a rank that was busy rather than stuck (fixtures from real runs here where the
failure runs on a CPU; see fixtures/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.explain import explain_paths
from ddpdoctor.explain.lines import clean

FIXTURES = Path(__file__).parent / "fixtures"
# how the programs of these real runs label their lines: torchrun, Lightning, and the scripts' own prints
LABEL = re.compile(r"^(?:\[rank(\d+)\]:|\[rank: (\d+)\]|\[default(\d+)\]:|rank (\d+) (?!and)|RANK=(\d+) )")
LABELLED = ["checkpoint_rename_race", "slow_rank_eval", "lightning_f1_strategy_reduce",
            "f6_sigsegv_faulthandler_tee"]


@pytest.mark.parametrize("name", LABELLED)
def test_every_rank_labelled_line_of_a_real_run_is_attributed_to_its_rank(name: str) -> None:
    labelled = 0
    for line in (FIXTURES / f"{name}.log").read_text(encoding="utf-8").splitlines():
        label = LABEL.match(line)
        if label:
            labelled += 1
            assert clean(line)[0] == int(next(g for g in label.groups() if g is not None)), line
    assert labelled


def _fold(text: str, width: int) -> str:
    """What a terminal of `width` columns shows, as a user copies it: every line cut into pieces."""
    out = []
    for line in text.splitlines():
        out += [line[i:i + width] for i in range(0, len(line), width)] or [""]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    "name",
    ["nccl_watchdog_new", "checkpoint_rename_race", "slow_rank_eval", "f6_gloo_timeout", "duplicate_gpu"],
)
def test_a_log_cut_at_the_terminal_width_is_read_like_the_original(name: str, tmp_path: Path) -> None:
    original = (FIXTURES / f"{name}.log").read_text(encoding="utf-8")
    folded = tmp_path / f"{name}.log"
    folded.write_text(_fold(original, 100), encoding="utf-8")
    want = explain_paths([str(FIXTURES / f"{name}.log")]).diagnoses[0]
    got = explain_paths([str(folded)]).diagnoses[0]
    assert got.slug == want.slug
    for fact in ("culprit_rank", "reporting_ranks", "silent_ranks", "seq_num", "error", "section", "errno"):
        assert got.finding.facts.get(fact) == want.finding.facts.get(fact), fact
    # the line numbers are those of the folded log: the message starts on the line reported
    assert got.log_line is not None and got.log_line.line is not None
    reported = clean(folded.read_text(encoding="utf-8").splitlines()[got.log_line.line - 1])[1]
    assert reported and reported[:40] in got.finding.evidence[0].text


def test_hand_wrapped_message_is_read_as_one_line(tmp_path: Path) -> None:
    log = tmp_path / "pasted.log"
    log.write_text(
        "[rank1]:[E0312 09:14:02 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
        "operation timeo\n"
        "[rank1]:ut: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeo\n"
        "[rank1]:ut(ms)=600000) ran for 600123 milliseconds before timing out.\n"
        "[rank2]:[E0312 09:14:02 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation "
        "timeout: "
        "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600125 "
        "milliseconds before timing out.\n",
        encoding="utf-8",
    )
    best = explain_paths([str(log)]).diagnoses[0]
    assert best.slug == "collective-timeout"
    assert best.finding.facts["reporting_ranks"] == [1, 2]
    assert best.finding.facts["silent_ranks"] == [0]
    assert best.log_line is not None and best.log_line.line == 1


def test_an_error_outside_the_catalogue_is_named_with_its_rank_not_called_a_hang() -> None:
    explanation = explain_paths([str(FIXTURES / "invalid_device_ordinal.log")])
    best = explanation.diagnoses[0].finding
    assert best.class_ == "distributed-error" and best.facts["rank"] == 2
    assert "hang" not in " ".join(explanation.diagnoses[0].explanation)
    assert best.confidence is not None and best.confidence <= 0.7


def test_a_strategy_reduce_is_not_called_a_logged_metric() -> None:
    diagnosis = explain_paths([str(FIXTURES / "lightning_f1_strategy_reduce.log")]).diagnoses[0]
    said = " ".join(diagnosis.explanation) + (diagnosis.finding.fix.message if diagnosis.finding.fix else "")
    assert "strategy" in said and "sync_dist=True`" not in said.split("or reduce")[0]
    assert "Upgrade Lightning" not in said


def test_ranks_timing_out_at_different_collectives_name_the_one_away_from_the_others(
    tmp_path: Path,
) -> None:
    log = tmp_path / "diverged.log"
    report = ("[rank{r}]:[E0312 09:14:02 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
              "operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=8, NumelOut=8, "
              "Timeout(ms)=600000) ran for 600123 milliseconds before timing out.\n")
    places = [(0, 40, "ALLREDUCE"), (1, 40, "ALLREDUCE"), (2, 38, "BROADCAST")]
    log.write_text("".join(report.format(r=r, seq=seq, op=op) for r, seq, op in places), encoding="utf-8")
    diagnosis = explain_paths([str(log)]).diagnoses[0]
    assert diagnosis.slug == "collective-timeout"
    assert diagnosis.finding.facts["outlier_ranks"] == [2]
    assert "rank 2 in BROADCAST #38" in diagnosis.explanation[0]


def test_a_job_that_ends_in_a_native_abort_is_not_called_a_hang(tmp_path: Path) -> None:
    log = tmp_path / "aborted.log"
    log.write_text("W0312 torch/distributed/run.py:792] Setting OMP_NUM_THREADS environment variable\n"
                   "[rank0]: epoch 0 step 10 loss 0.5\n[rank1]: epoch 0 step 10 loss 0.5\n"
                   "Aborted (core dumped)\n",
                   encoding="utf-8")
    diagnosis = explain_paths([str(log)]).diagnoses[0]
    assert diagnosis.slug == "distributed-error"
    assert diagnosis.finding.facts["first_error"] == "Aborted (core dumped)"
    assert diagnosis.log_line is not None and diagnosis.log_line.line == 4
