"""The same failures as the fixture logs, dressed the way other launchers and terminals dress them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.explain import LogSource, explain_logs, knowledge_base
from ddpdoctor.explain.lines import clean, rank_segment, split_rank

FIXTURES = Path(__file__).parent / "fixtures"


def explain_text(tmp_path: Path, text: str | bytes, name: str = "job.log"):
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8", newline="")
    else:
        path.write_bytes(text)
    return explain_logs([LogSource.from_arg(str(path))], knowledge_base())


def summary(explanation) -> tuple[str, dict]:
    best = explanation.diagnoses[0].finding
    return best.class_, dict(best.facts)


@pytest.mark.parametrize(
    ("line", "rank", "text"),
    [
        ("[rank3]: RuntimeError: x", 3, "RuntimeError: x"),
        (
            "[rank12]:[E1122 10:24:44 ProcessGroupNCCL.cpp:616] y",
            12,
            "[E1122 10:24:44 ProcessGroupNCCL.cpp:616] y",
        ),
        ("[default1]:Traceback (most recent call last):", 1, "Traceback (most recent call last):"),
        ("[rank: 1] Seed set to 42", 1, "Seed set to 42"),
        ("[1,3]<stderr>:RuntimeError: x", 3, "RuntimeError: x"),
        ("rank 2: RuntimeError: x", 2, "RuntimeError: x"),
        ("\x1b[31m[rank1]:\x1b[0m RuntimeError: x\r", 1, "RuntimeError: x"),
        ("Epoch 1: 10%|#\rEpoch 1: 20%|##\r[rank0]: RuntimeError: x", 0, "RuntimeError: x"),
        ("  rank      : 1 (local_rank: 1)", None, "  rank      : 1 (local_rank: 1)"),
        ("RuntimeError: no prefix", None, "RuntimeError: no prefix"),
    ],
)
def test_rank_prefixes(line: str, rank: int | None, text: str) -> None:
    assert clean(line) == (rank, text)


def test_split_rank_leaves_unprefixed_lines_alone() -> None:
    assert split_rank("[Rank 0] Watchdog caught ...") == (None, "[Rank 0] Watchdog caught ...")


@pytest.mark.parametrize(
    "dress",
    [
        pytest.param(
            lambda s: re.sub(r"^\[rank(\d+)\]:", r"[default\1]:", s, flags=re.M), id="torchrun-tee-default"
        ),
        pytest.param(
            lambda s: re.sub(r"^\[rank(\d+)\]:", r"[1,\1]<stderr>:", s, flags=re.M), id="mpirun-tag-output"
        ),
        pytest.param(lambda s: re.sub(r"^\[rank(\d+)\]:", r"rank \1:", s, flags=re.M), id="rank-colon"),
        pytest.param(lambda s: s.replace("\n", "\r\n"), id="crlf"),
        pytest.param(
            lambda s: re.sub(r"(RuntimeError|\[rank\d\]:)", "\x1b[1;31m\\1\x1b[0m", s), id="ansi-colours"
        ),
    ],
)
def test_dressed_logs_give_the_same_diagnosis(tmp_path: Path, dress) -> None:
    for name in ("f8_unused", "f1_cuda_gloo", "nccl_watchdog_new", "f4_detail_mismatch"):
        original = (FIXTURES / f"{name}.log").read_text()
        plain = summary(explain_text(tmp_path, original))
        dressed = summary(explain_text(tmp_path, dress(original)))
        assert dressed == plain, name


def test_interleaved_ranks_are_demultiplexed(tmp_path: Path) -> None:
    lines = (FIXTURES / "f8_unused.log").read_text().splitlines()
    rank0 = [line for line in lines if line.startswith("[rank0]")]
    rank1 = [
        line.replace("[rank0]", "[rank1]").replace("for rank 0: 2 3", "for rank 1: 0 1") for line in rank0
    ]
    mixed = [line for pair in zip(rank1, rank0, strict=True) for line in pair]  # strictly alternating
    explanation = explain_text(tmp_path, "\n".join(mixed) + "\n")
    best = explanation.diagnoses[0].finding
    assert best.class_ == "unused-parameters"
    assert best.facts["ranks"] == [0, 1]
    # the indices come from the primary hit's own rank, not from the neighbouring line of the other rank
    primary_rank = best.evidence[0].rank
    assert best.facts["parameter_indices"] == ("2 3" if primary_rank == 0 else "0 1")
    assert best.facts["index_rank"] == primary_rank


def test_message_glued_to_a_progress_bar(tmp_path: Path) -> None:
    log = (
        "Epoch 0:   6%|██    | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6][E "
        "ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, "
        "Timeout(ms)=1800000) ran for 25624887 milliseconds before timing out.\n"
    )
    cls, facts = summary(explain_text(tmp_path, log))
    assert cls == "collective-timeout" and facts["seq_num"] == 96120 and facts["reporting_ranks"] == [0]


def test_truncated_log_still_points_at_a_dead_peer(tmp_path: Path) -> None:
    # cut before torchrun's summary: only rank 0's `Connection closed by peer` is left
    text = (FIXTURES / "f6_sigkill.log").read_text()
    cut = text[: text.index("W1122")]
    cls, facts = summary(explain_text(tmp_path, cut))
    assert cls == "dead-rank" and facts["reporting_ranks"] == [0]


def test_traceback_cut_mid_line(tmp_path: Path) -> None:
    text = (FIXTURES / "f9_no_init.log").read_text()
    cut = text[: text.index("please make sure")]
    assert summary(explain_text(tmp_path, cut))[0] == "process-group-missing"


@pytest.mark.parametrize("block_size", [64, 1000, 4096])
def test_block_boundaries_do_not_change_anything(tmp_path: Path, block_size: int) -> None:
    # the scanner carries context lines across blocks; tiny blocks put every boundary somewhere interesting
    kb = knowledge_base()
    for path in sorted(FIXTURES.glob("*.log")):
        whole = explain_logs([LogSource.from_arg(str(path))], kb)
        pieces = explain_logs([LogSource.from_arg(str(path))], kb, block_size=block_size)
        assert [d.finding for d in pieces.diagnoses] == [d.finding for d in whole.diagnoses], path.name
        assert pieces.stats.lines == whole.stats.lines == len(path.read_bytes().splitlines())


def test_identical_repeats_are_counted_not_kept(tmp_path: Path) -> None:
    line = "[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:5250.\n"
    explanation = explain_text(tmp_path, line * 5000)
    assert explanation.stats.hits == 5000
    assert explanation.stats.dropped_hits == 5000 - 3
    assert explanation.diagnoses[0].finding.class_ == "dead-rank"


def test_a_handled_exception_is_not_the_culprit(tmp_path: Path) -> None:
    # rank 1 logs a caught KeyError and carries on; only the exception a rank dies with can be the cause
    log = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/data/loader.py", line 88, in load\n'
        "[rank1]: KeyError: 'sample_17'\n"
        "[rank1]: Epoch 0: 40%|####      | 400/1000 loss=0.31\n"
        "[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:5538.\n"
    )
    cls, facts = summary(explain_text(tmp_path, log))
    assert cls == "dead-rank" and "culprit_rank" not in facts and facts["reporting_ranks"] == [0]
    # the same exception as the rank's last words is the cause
    fatal = log.replace("[rank1]: Epoch 0: 40%|####      | 400/1000 loss=0.31\n", "")
    cls, facts = summary(explain_text(tmp_path, fatal))
    assert cls == "dead-rank" and facts["culprit_rank"] == 1 and facts["exception"] == "KeyError"


def test_a_watchdog_storm_on_many_ranks_keeps_every_reporting_rank(tmp_path: Path) -> None:
    # 1024 ranks, all but rank 777 report the timeout: more hits than the scanner keeps with context
    line = (
        "[rank{r}]:[E1122 10:24:44.9 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
        "ran for "
        "600020 milliseconds before timing out.\n"
    )
    log = "".join(line.format(r=r) for r in range(1024) if r != 777)
    explanation = explain_text(tmp_path, log)
    assert explanation.stats.dropped_hits > 0
    cls, facts = summary(explanation)
    assert cls == "collective-timeout"
    assert facts["silent_ranks"] == [777]
    assert len(facts["reporting_ranks"]) == 1023
    assert explanation.diagnoses[0].explanation[0].startswith("Rank(s) 0-776, 778-1023 waited 600020 ms")


@pytest.mark.parametrize(
    ("values", "text"),
    [
        ([0, 1, 2, 3, 5], "0-3, 5"),
        ([4], "4"),
        ([1, 2], "1, 2"),
        ([0, 2, 3, 4, 9, 10], "0, 2-4, 9, 10"),
        (["a"], "a"),
    ],
)
def test_compact_rank_lists(values: list, text: str) -> None:
    from ddpdoctor.render.ranges import compact

    assert compact(values) == text


@pytest.mark.parametrize(
    ("line", "column", "segment"),
    [
        ("[rank0]: a [rank1]: b", 3, "[rank0]: a "),
        ("[rank0]: a [rank1]: b", 15, "[rank1]: b"),
        ("[default0]:[rank0]: a", 15, "[default0]:[rank0]: a"),  # stacked prefixes: one rank
        ("Epoch 0: 6%|#[rank0]: x", 20, "[rank0]: x"),  # a progress bar without its newline
        ("[rank0]: plain line", 10, "[rank0]: plain line"),
    ],
)
def test_rank_segment(line: str, column: int, segment: str) -> None:
    start, end = rank_segment(line, column)
    assert line[start:end] == segment


def test_two_ranks_glued_on_one_line_are_two_reports(tmp_path: Path) -> None:
    # rank 2's watchdog report written right after rank 0's, without a newline between them: rank 2 reported
    # the timeout too, so rank 1 stays the only silent rank
    lines = (FIXTURES / "nccl_watchdog_new.log").read_text().splitlines()
    first0 = next(i for i, line in enumerate(lines) if line.startswith("[rank0]:[E") and "Watchdog" in line)
    first2 = next(i for i, line in enumerate(lines) if line.startswith("[rank2]:[E") and "Watchdog" in line)
    glued = list(lines)
    glued[first0] += glued.pop(first2)
    plain = summary(explain_text(tmp_path, "\n".join(lines) + "\n"))
    cls, facts = summary(explain_text(tmp_path, "\n".join(glued) + "\n"))
    assert cls == plain[0] == "collective-timeout"
    assert facts["reporting_ranks"] == plain[1]["reporting_ranks"] == [0, 2, 3]
    assert facts["silent_ranks"] == plain[1]["silent_ranks"] == [1]


def test_interleaved_ranks_glued_on_one_line(tmp_path: Path) -> None:
    # each physical line holds one line of rank 1 and then one of rank 0: both ranks' reports are read,
    # each with its own indices
    lines = (FIXTURES / "f8_unused.log").read_text().splitlines()
    rank0 = [line for line in lines if line.startswith("[rank0]")]
    rank1 = [
        line.replace("[rank0]", "[rank1]").replace("for rank 0: 2 3", "for rank 1: 0 1") for line in rank0
    ]
    glued = [a + b for a, b in zip(rank1, rank0, strict=True)]
    best = explain_text(tmp_path, "\n".join(glued) + "\n").diagnoses[0].finding
    assert best.class_ == "unused-parameters"
    assert best.facts["ranks"] == [0, 1]
    assert best.facts["parameter_indices"] == ("2 3" if best.evidence[0].rank == 0 else "0 1")


def test_guard_report_and_slow_rank_reading_give_one_diagnosis(tmp_path: Path) -> None:
    # `ddpdoctor run`'s own F13 report, then the same run's timeout with rank 0's progress lines before it
    text = "".join((FIXTURES / f"{name}.log").read_text()
                   for name in ("guard_single_rank_long_section", "slow_rank_eval"))
    diagnoses = explain_text(tmp_path, text).diagnoses
    slow = [d for d in diagnoses if d.slug == "single-rank-long-section"]
    assert len(slow) == 1 and diagnoses[0] is slow[0]
    assert slow[0].signature == "guard-report"  # the guard measured the section: its report leads
    facts = slow[0].finding.facts
    assert facts["section"] == "evaluation" and facts["section_rank"] == 0  # the log's reading adds to it
    assert facts["configured_timeout_s"] == 5.0
    assert [d.slug for d in diagnoses].count("collective-timeout") == 1
