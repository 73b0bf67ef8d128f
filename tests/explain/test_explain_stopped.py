"""`explain` on the log a hung or killed job leaves: it started, printed some steps, and then stopped with no
error in it (killed by `timeout`, a scheduler or SIGKILL). The hang_* fixtures are real runs of such jobs
(fixtures/README.md); the variants below are written from the real message texts of other launchers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.explain import explain_paths
from ddpdoctor.reports import LogKind

FIXTURES = Path(__file__).parent / "fixtures"
DEATH_SIGNAL = "Received 15 death signal, shutting down workers"


def _lines(name: str) -> list[str]:
    return (FIXTURES / f"{name}.log").read_text().splitlines()


def _best(path: Path | str):
    explanation = explain_paths([str(path)])
    assert explanation.diagnoses, explanation.kind
    return explanation.diagnoses[0]


def test_a_torchrun_job_stopped_by_timeout_is_a_likely_hang_with_each_ranks_last_line() -> None:
    """`timeout 20 torchrun --tee 3 ...` on a job whose rank 1 is stuck: torchrun's agent gets the SIGTERM."""
    lines = _lines("hang_torchrun_timeout")
    stop = next(n for n, line in enumerate(lines, 1) if DEATH_SIGNAL in line)
    # what the user would read off the log: the last line each rank printed before the stop, and its time
    last = {
        rank: max(n for n, line in enumerate(lines[: stop - 1], 1) if line.startswith(f"[default{rank}]:"))
        for rank in (0, 1)
    }
    glog = re.match(r"W(\d\d)(\d\d) (\d\d:\d\d:\d\d)", lines[stop - 1])
    assert glog
    diagnosis = _best(FIXTURES / "hang_torchrun_timeout.log")
    finding = diagnosis.finding
    assert finding.class_ == "collective-timeout" and "most likely a hang" in finding.message
    assert finding.confidence is not None and finding.confidence <= 0.5  # no error in the log: not certain
    assert finding.facts["stopped_by"] == "SIGTERM"
    assert finding.facts["stopped_at"] == f"{glog[1]}-{glog[2]} {glog[3]}"
    assert finding.facts["ranks"] == [0, 1]
    evidence = {e.rank: e for e in finding.evidence if e.rank is not None}
    for rank, line in last.items():
        assert evidence[rank].line == line
        assert evidence[rank].text == lines[line - 1].removeprefix(f"[default{rank}]:")
    said = " ".join(diagnosis.explanation)
    assert "Last seen: rank 0 at line" in said and "rank 1 at line" in said
    assert (
        finding.fix is not None
        and "`ddpdoctor run --hang-after 60 -- torchrun <its arguments>`" in finding.fix.message
    )


def test_the_command_and_script_in_a_traced_log_are_the_next_commands() -> None:
    """A batch script with `set -x` logs `+ torchrun ... train.py`: that is the command to run under the
    guard."""
    traced = next(line for line in _lines("hang_torchrun_traced") if line.startswith("+ "))
    finding = _best(FIXTURES / "hang_torchrun_traced.log").finding
    assert finding.facts["command"] == traced[2:]
    assert finding.fix is not None
    assert f"`ddpdoctor run --hang-after 60 -- {traced[2:]}`" in finding.fix.message
    assert "`ddpdoctor check .` in the project of `hang_torchrun.py`" in finding.fix.message


def test_a_lightning_job_killed_after_ignoring_timeouts_sigterm_is_a_likely_hang(cli) -> None:
    """`timeout -k 10 40 python train.py`: Lightning's main process, stuck in the collective, ignores the
    SIGTERM; the SIGKILL ten seconds later leaves a log that just stops."""
    lines = _lines("hang_lightning_timeout")
    result = cli("explain", str(FIXTURES / "hang_lightning_timeout.log"))
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "1. collective-timeout" in out and "most likely a hang" in out
    assert "The job started (Lightning, 2 ranks) and then its output ends" in out
    assert f"line {len(lines)}: {lines[-1]}" in out  # the last line, as evidence
    assert "`ddpdoctor run --hang-after 60 -- python <your script>`" in out
    assert "timeout -k" in out  # how to stop such a job next time


def test_a_torchrun_job_killed_with_sigkill_is_a_likely_hang_with_lower_confidence() -> None:
    stopped = _best(FIXTURES / "hang_torchrun_timeout.log").finding
    cut_off = _best(FIXTURES / "hang_torchrun_sigkill.log").finding
    assert cut_off.class_ == "collective-timeout" and cut_off.facts["ending"] == "cut-off"
    assert (cut_off.confidence or 0) < (stopped.confidence or 0)
    assert cut_off.facts["launcher"] == "torchrun"  # from its OMP_NUM_THREADS banner


def test_a_job_whose_main_process_was_sigkilled_is_a_dead_rank() -> None:
    """The OOM killer's SIGKILL, reported by the batch script's shell (`line 1: PID Killed  python ...`)."""
    killed = next(line for line in _lines("hang_lightning_oom_killed") if " Killed " in line)
    diagnosis = _best(FIXTURES / "hang_lightning_oom_killed.log")
    assert diagnosis.finding.class_ == "dead-rank"
    assert diagnosis.finding.facts["stopped_by"] == "SIGKILL"
    assert diagnosis.finding.facts["command"] == killed.split(" Killed ", 1)[1].strip()
    assert any("dmesg" in fix for fix in diagnosis.other_fixes or ())


def test_an_accelerate_job_is_named_as_such() -> None:
    finding = _best(FIXTURES / "hang_accelerate_timeout.log").finding
    assert finding.facts["launcher"] == "accelerate"
    assert finding.fix is not None and "accelerate launch <its arguments>" in finding.fix.message


def test_a_finished_job_is_one_line_and_no_diagnosis(cli) -> None:
    explanation = explain_paths([str(FIXTURES / "lightning_finished.log")])
    assert explanation.diagnoses == [] and explanation.kind is LogKind.FINISHED
    result = cli("explain", str(FIXTURES / "lightning_finished.log"))
    assert result.returncode == 1
    assert result.stdout.count("\n") == 1 and "ran to its end" in result.stdout


def test_an_empty_log_is_one_line(cli, tmp_path: Path) -> None:
    for name, content in (("empty.log", ""), ("blank.log", "\n\n   \n")):
        (tmp_path / name).write_text(content)
        result = cli("explain", str(tmp_path / name))
        assert result.returncode == 1
        assert result.stdout.count("\n") == 1 and "empty" in result.stdout, result.stdout


def test_a_log_with_nothing_distributed_is_one_line_and_verbose_says_what_was_looked_for(
    cli, tmp_path: Path
) -> None:
    log = tmp_path / "fine.log"
    log.write_text("Epoch 1: loss=0.3\nTraceback (most recent call last):\nKeyError: 'x'\n")
    result = cli("explain", str(log))
    assert result.returncode == 1
    assert result.stdout.count("\n") == 1 and "no distributed-training failure" in result.stdout
    assert "<device_" not in result.stdout  # no internal patterns
    verbose = cli("explain", "--verbose", str(log))
    assert verbose.returncode == 1 and "Looked for:" in verbose.stdout
    assert "collective-timeout: Watchdog caught" in verbose.stdout


# Variants from other launchers and schedulers, on top of the real log of a job killed with SIGKILL (which
# ends with the ranks' output): what each adds is its real message text.
VARIANTS = {
    "slurm time limit": (
        "slurmstepd: error: *** JOB 4242 ON node17 CANCELLED AT 2026-11-24T21:30:00 DUE TO TIME LIMIT ***",
        "collective-timeout",
        "SIGTERM",
        "Slurm cancelled the job (time limit) at 2026-11-24 21:30:00",
    ),
    "ctrl-c": ("KeyboardInterrupt", "collective-timeout", "SIGINT", "KeyboardInterrupt"),
    "shell killed": (
        "/var/spool/slurmd/job4242/slurm_script: line 12: 31337 Killed                  torchrun "
        "--nproc-per-node 2 train.py",
        "dead-rank",
        "SIGKILL",
        "`torchrun --nproc-per-node 2 train.py` killed",
    ),
    "lightning notifier": (
        "[rank: 0] Received SIGTERM: 15",
        "collective-timeout",
        "SIGTERM",
        "Lightning received SIGTERM",
    ),
    "agent by name": (
        "W1124 21:30:00.000000 42 torch/distributed/elastic/agent/server/api.py:720] Received "
        "Signals.SIGTERM death signal, shutting down workers",
        "collective-timeout",
        "SIGTERM",
        "torchrun's agent received SIGTERM",
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stops_from_other_launchers_and_schedulers(tmp_path: Path, variant: str) -> None:
    line, slug, signal, said = VARIANTS[variant]
    log = tmp_path / "job.log"
    log.write_text((FIXTURES / "hang_torchrun_sigkill.log").read_text() + line + "\n")
    diagnosis = _best(log)
    assert diagnosis.finding.class_ == slug
    assert diagnosis.finding.facts["stopped_by"] == signal
    assert said in " ".join(diagnosis.explanation)


def test_rank_log_files_name_the_rank_that_stopped_printing_first(tmp_path: Path) -> None:
    """torchrun --log-dir style, one file per rank: rank 1's file ends two steps before rank 0's."""
    steps = [line for line in _lines("hang_torchrun_sigkill") if line.startswith("step ")]
    (tmp_path / "rank0.log").write_text("\n".join(steps) + "\n")
    (tmp_path / "rank1.log").write_text("\n".join(steps[:2]) + "\n")
    explanation = explain_paths([str(tmp_path / "rank0.log"), str(tmp_path / "rank1.log")])
    finding = explanation.diagnoses[0].finding
    assert finding.class_ == "collective-timeout" and finding.facts["ranks"] == [0, 1]
    last = {e.rank: (e.line, e.text) for e in finding.evidence}
    assert last[0][0] == len(steps) and last[1] == (2, f"{tmp_path / 'rank1.log'}: {steps[1]}")


def test_timestamps_give_the_time_of_the_last_output(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "[2026-11-24 21:00:01,120][torch.distributed][INFO] Added key: store_based_barrier_key:1 to store "
        "for rank: 0\n[rank0]: [2026-11-24 21:00:05,001][train][INFO] step 1 loss 0.5\n"
        "[rank1]: [2026-11-24 21:00:05,003][train][INFO] step 1 loss 0.4\n"
        "[rank0]: [2026-11-24 21:00:06,001][train][INFO] step 2 loss 0.3\n"
    )
    finding = _best(log).finding
    assert finding.facts["last_output_at"] == "2026-11-24 21:00:06"
    assert {e.rank: e.line for e in finding.evidence} == {1: 3, 0: 4}


def test_the_rank_that_stopped_printing_first_is_named_among_many(tmp_path: Path) -> None:
    """8 ranks with torchrun's `[rankN]:` prefixes; rank 5 prints nothing after step 1 while the others go on
    to step 3, then `timeout` stops the job."""
    lines = [f"[rank{r}]:Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/8" for r in range(8)]
    for step in range(4):
        lines += [f"[rank{r}]:step {step} loss 0.{r}{step}" for r in range(8) if not (r == 5 and step >= 2)]
    lines.append("W1124 21:22:27.519000 10441 torch/distributed/elastic/agent/server/api.py:753] "
                 f"{DEATH_SIGNAL}")
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    diagnosis = _best(log)
    finding = diagnosis.finding
    assert finding.facts["stopped_printing_first"] == 5 and finding.facts["ranks"] == list(range(8))
    said = " ".join(diagnosis.explanation)
    assert said.startswith("The job started (Lightning and torchrun, 8 ranks)")
    assert "Last seen: rank 5 at line " in said and "Rank 5 stopped printing first" in said
    assert finding.evidence[0].rank == 5 and len(finding.evidence) <= 6


def test_ranks_that_stop_together_are_not_blamed() -> None:
    finding = _best(FIXTURES / "hang_torchrun_timeout.log").finding
    assert "stopped_printing_first" not in finding.facts
