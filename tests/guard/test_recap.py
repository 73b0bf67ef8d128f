"""The verdict line `ddpdoctor run` prints last after a failed job, and `explain` reading it back: the parts
on their own (the real job's last lines are checked in test_run_jobs.py, on its rank-conditional run)."""

from __future__ import annotations

from ddpdoctor.explain.launcher import LauncherReport, RankExit, read_exit
from ddpdoctor.findings import Finding, Location, Severity
from ddpdoctor.guard.launch.recap import recap_lines, recap_of

DIVERGENCE = Finding(
    class_="collective-divergence",
    message="op mismatch: rank 1 all_reduce(SUM) [1] float32 vs rank 0 barrier",
    locations=(Location("/job/train.py", 27, rank=1), Location("/job/train.py", 30, rank=0)),
)
SAMPLER = Finding(class_="sampler-epoch", message="...", severity=Severity.WARNING,
                  locations=(Location("/job/train.py", 9),))


def test_the_verdict_names_the_culprit_its_line_the_class_and_the_report() -> None:
    recap = recap_of([SAMPLER, DIVERGENCE], ranks={0, 1}, report="out/report.json")
    assert recap is not None
    first, second = recap_lines(recap, torchrun=True)
    assert first == (
        "[ddpdoctor] verdict: rank 1 at /job/train.py:27, collective-divergence (report: out/report.json)"
    )
    assert second == (
        "[ddpdoctor] torchrun's \"Root Cause\" above is the first rank it saw exit: if it names rank 0, "
        "that rank was stopped after rank 1's failure and did not cause it"
    )
    # without torchrun (Lightning's launcher, mp.spawn) there is no "Root Cause" to speak of
    assert len(recap_lines(recap, torchrun=False)) == 1


def test_warnings_alone_get_no_verdict() -> None:
    assert recap_of([SAMPLER], ranks={0, 1}, report=None) is None


def test_explain_takes_the_verdict_over_torchruns_root_cause() -> None:
    recap = recap_of([DIVERGENCE], ranks={0, 1}, report=None)
    assert recap is not None
    verdict = read_exit(recap_lines(recap, torchrun=True)[0], [], [], 40, "job.log")
    assert verdict is not None and verdict.rank == 1 and verdict.guard_verdict
    report = LauncherReport()
    report.add(RankExit(0, 1, None, True, 30, "job.log"))  # torchrun's "Root Cause": the rank it saw first
    report.add(verdict)
    report.add(RankExit(1, 1, None, False, 25, "job.log"))
    assert report.first_failure is verdict
    assert report.facts() == {"first_failed_rank": 1}
