"""The guard's loader audits under `ddpdoctor run`, with no code change: plain torch under torchrun (the batch
loop inline and in a helper), Lightning under `python`, accelerate under `accelerate launch`; broken and
fixed jobs side by side in `jobs/loaders/`. Then the parts on their own: the epoch rule, the ranks a
finding lists, the summary."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch
from ports import free_port
from processes import TOKEN_VARIABLE, run_in_session
from runtime_jobs import LANE, run
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpdoctor.audits.loader_hooks import active, install_loader_audits
from ddpdoctor.audits.samplers import IterationWatch, Place
from ddpdoctor.demo.manifest import TEARDOWN_RERUNS, aborted_in_teardown
from ddpdoctor.findings import Finding, Location, Severity, dumps, loads
from ddpdoctor.guard.launch.found_by_ranks import with_ranks
from ddpdoctor.guard.protocol import RunDir
from ddpdoctor.render.audit_summary import render_summary

JOBS = Path(__file__).parent / "jobs" / "loaders"
BIN = Path(sys.executable).parent
FINISHED = re.compile(r"rank \d: (?:done|fit done)")


def job_line(script: str, marker: str) -> int:
    lines = (JOBS / script).read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# line: {marker}"))


def run_guarded(command: list[str], report: Path, *, strict: bool = False, must_pass: bool = False,
                timeout: float = 120) -> tuple[int, str]:
    """`ddpdoctor run --report REPORT [--strict] -- COMMAND` as a user types it, in a session of its own. A
    job
    meant to pass is run again if it died only of torch 2.13's exit-time abort (see `aborted_in_teardown`)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k == TOKEN_VARIABLE or not k.startswith(("DDPDOCTOR_", "MASTER_", "TORCHELASTIC", "LOCAL_RANK"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", COLUMNS="200", MASTER_ADDR="127.0.0.1")
    guarded = [
        sys.executable,
        "-m",
        "ddpdoctor",
        "run",
        "--report",
        str(report),
        *(["--strict"] if strict else []),
        "--",
        *command,
    ]
    for _ in range(1 + (TEARDOWN_RERUNS if must_pass else 0)):
        env["MASTER_PORT"] = str(free_port())  # Lightning's rendezvous
        done = run_in_session(guarded, timeout=timeout, env=env, cwd=JOBS, stop_gently=True)
        if not (must_pass and aborted_in_teardown(done.returncode, done.stdout, FINISHED)):
            break
    return done.returncode, done.stdout


def torchrun(script: str, mode: str) -> list[str]:
    return [
        str(BIN / "torchrun"),
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(JOBS / script),
        mode,
    ]


def accelerate_launch(script: str, mode: str) -> list[str]:
    return [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            str(JOBS / script), mode]


def report_of(report: Path) -> list[Finding]:
    return loads((report / "report.json").read_text())


def lines_of(finding: Finding) -> list[tuple[str, int | None]]:
    return [(os.path.basename(loc.path), loc.line) for loc in finding.locations]


# ------------------------------------------------------------------------------ plain torch, torchrun


def test_torch_loop_without_set_epoch_inline_and_in_a_helper(tmp_path: Path) -> None:
    """One run, under `--strict`: its warnings make the exit code 1, and the report and what the ranks print
    are those of a plain run (--strict changes the exit code only). That warnings alone leave the exit code
    0 without it is read from the Lightning job below (test_lightning_nested_sampler_without_callback) and
    tests/guard/test_replicas.py's never-synced job: a second run of this one cost the suite a 2-rank job."""
    script = "torch_loop.py"
    rc, output = run_guarded(torchrun(script, "broken"), tmp_path, strict=True, must_pass=True)
    assert rc == 1, output[-4000:]

    findings = report_of(tmp_path)
    assert [f.class_ for f in findings] == ["sampler-epoch"] * 3, output[-4000:]
    assert all(f.severity is Severity.WARNING and f.facts["found_by_ranks"] == [0, 1] for f in findings)
    by_loop = {lines_of(f)[0][1]: f for f in findings}
    inline, helper, extra = (job_line(script, m) for m in ("inline loop", "helper loop", "extra loop"))
    assert set(by_loop) == {inline, helper, extra}
    for loop, built in (
        (inline, job_line(script, "built inline")),
        (helper, job_line(script, "built helper")),
    ):
        finding = by_loop[loop]
        assert lines_of(finding) == [(script, loop), (script, built)]
        assert (
            f"the DistributedSampler built at {script}:{built} (shuffle=True) is iterated again at epoch 0 "
            f"by the loop at {script}:{loop}: `set_epoch` is never called on it" in finding.message
        )
        assert finding.fix is not None and "set_epoch(epoch)" in finding.fix.message
    unsharded = by_loop[extra]
    assert "shuffles with a RandomSampler" in unsharded.message and "2-rank job" in unsharded.message

    # each rank says it once when it finds it; the summary at the end says it all once
    for rank in (0, 1):
        assert output.count(f"[ddpdoctor] warning: [sampler-epoch] (rank {rank}) ") == 3, output[-4000:]
    summary = output[output.index("ddpdoctor summary: 3 warnings"):]
    for loop in (inline, helper, extra):
        assert f"[sampler-epoch] {script}:{loop} (ranks 0, 1)" in summary, summary


@pytest.mark.xdist_group(LANE)
def test_torch_loop_done_right_is_silent() -> None:
    """set_epoch every epoch, a peek with next(iter(loader)) before training, an evaluation pass over the
    training loader, an unshuffled DistributedSampler iterated every epoch: nothing to say. Read from the
    runtime audits' fixed torch job, which runs these loops (`torch_loop.loops("fixed")`) under --strict
    after its checkpoints: one 2-rank job for both (tests/audits/runtime_jobs.py)."""
    job = run("torch", "fixed")
    assert job.returncode == 0, job.output[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: loaders done" in job.output, job.output[-4000:]
    assert job.findings == []
    assert "[ddpdoctor]" not in job.output and "ddpdoctor summary" not in job.output


# ------------------------------------------------------------------------------ accelerate launch


def test_accelerate_loaders_not_prepared(tmp_path: Path) -> None:
    script = "accelerate_loop.py"
    rc, output = run_guarded(accelerate_launch(script, "broken"), tmp_path, timeout=150)
    assert rc == 1, output[-4000:]  # the generator on an accelerator fails the job at its first batch
    findings = {(f.class_, lines_of(f)[0][1]): f for f in report_of(tmp_path)}
    own, shuffled, generator = (job_line(script, m) for m in ("own loop", "shuffled loop", "generator loop"))
    assert ("sampler-epoch", own) in findings and ("sampler-epoch", shuffled) in findings, output[-4000:]
    assert lines_of(findings["sampler-epoch", own]) == [(script, own), (script, job_line(script, "built"))]
    assert "shuffles with a RandomSampler" in findings["sampler-epoch", shuffled].message
    f2 = findings["init-module-scope", generator]
    assert f2.severity is Severity.ERROR and f2.facts["device"] == "cuda:0"
    assert f2.facts["found_by_ranks"] == [0, 1]
    assert "ddpdoctor summary: 1 error, 2 warnings" in output


@pytest.mark.xdist_group(LANE)
def test_accelerate_prepared_loader_is_silent() -> None:
    """A `shuffle=True` loader through `accelerator.prepare` (accelerate's seedable sampler, its batches
    sharded by BatchSamplerShard, its epoch moved at each pass) and a DistributedSampler whose epoch is
    set. Read from the runtime audits' fixed accelerate job, which runs these loaders
    (`accelerate_loop.loops(accelerator, "fixed")`) under --strict after its saves: one 2-rank job for
    both."""
    job = run("accelerate", "fixed")
    assert job.returncode == 0, job.output[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: loaders done" in job.output, job.output[-4000:]
    assert job.findings == []
    assert "ddpdoctor summary" not in job.output


# ------------------------------------------------------------------------------ Lightning under python


def lightning(mode: str) -> list[str]:
    return [sys.executable, str(JOBS / "lightning_fit.py"), mode]


def test_lightning_nested_sampler_without_callback(tmp_path: Path) -> None:
    script = "lightning_fit.py"
    rc, output = run_guarded(lightning("broken"), tmp_path, must_pass=True, timeout=150)
    assert rc == 0, output[-4000:]  # warnings leave the exit code alone (without --strict)
    (finding,) = report_of(tmp_path)
    fit, built = job_line(script, "fit"), job_line(script, "built")
    # Lightning's loop iterates it: the user's line is the fit call
    assert lines_of(finding) == [(script, fit), (script, built)]
    assert f"by the loop at {script}:{fit} (through lightning)" in finding.message
    assert "`loader.sampler.inner`: the wrapper around it must forward `set_epoch`" in finding.message
    assert finding.facts["found_by_ranks"] == [0, 1]


def test_lightning_callback_findings_join_the_report_once(tmp_path: Path) -> None:
    """With DoctorCallback: its own finding (fit inside init_module) goes into report.json beside the guard's,
    and the nested sampler is reported once, by the guard, not again by the callback."""
    rc, output = run_guarded(lightning("callback"), tmp_path, must_pass=True, timeout=150)
    assert rc == 0, output[-4000:]
    findings = report_of(tmp_path)
    assert sorted(f.class_ for f in findings) == ["init-module-scope", "sampler-epoch"], output[-4000:]
    assert all(f.facts["found_by_ranks"] == [0, 1] for f in findings)
    assert "ddpdoctor summary: 2 warnings" in output


def test_lightning_as_usually_written_is_silent(tmp_path: Path) -> None:
    """`shuffle=True`: Lightning adds its DistributedSampler and sets its epoch; the callback too."""
    rc, output = run_guarded(lightning("fixed"), tmp_path, must_pass=True, timeout=150)
    assert rc == 0, output[-4000:]
    assert report_of(tmp_path) == []
    assert "ddpdoctor summary" not in output


# ------------------------------------------------------------------------------ the epoch rule


DATA = TensorDataset(torch.arange(16.0))
LOOP, BUILT = Place("/job/train.py", 30), Place("/job/train.py", 20)


class Passes:
    """Iterations of one sampler as the guard sees them, with the program's `set_epoch` calls counted."""

    def __init__(self, shuffle: bool = True) -> None:
        self.sampler = DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=shuffle)
        self.calls = 0
        self.watch = IterationWatch()
        self.found: list[Finding] = []

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self.calls += 1

    def iterate(self) -> None:
        finding = self.watch.iterated(self.sampler, "sampler", self.calls, LOOP, BUILT)
        if finding is not None:
            self.found.append(finding)
        list(DataLoader(DATA, sampler=self.sampler))


def test_a_sampler_iterated_again_with_set_epoch_never_called_is_reported_once() -> None:
    passes = Passes()
    passes.iterate()
    assert passes.found == []  # once is fine
    passes.iterate()
    passes.iterate()
    (finding,) = passes.found
    assert "`set_epoch` is never called on it" in finding.message
    assert lines_of(finding) == [("train.py", 30), ("train.py", 20)]


def test_a_peek_or_an_evaluation_pass_is_not_the_bug() -> None:
    passes = Passes()
    passes.iterate()  # next(iter(loader)) before training
    for epoch in range(3):
        passes.set_epoch(epoch)
        passes.iterate()  # training
        passes.iterate()  # evaluation over the training loader
    assert passes.found == []


def test_set_epoch_with_an_epoch_that_never_moves_is_reported() -> None:
    passes = Passes()
    for _ in range(3):
        passes.set_epoch(0)  # set_epoch(self.epoch) of a counter never incremented
        passes.iterate()
    (finding,) = passes.found
    assert "`set_epoch` is called with the epoch it already has (0)" in finding.message


def test_a_fresh_sampler_every_epoch_is_the_same_order_every_epoch() -> None:
    watch = IterationWatch()
    orders, found = [], []
    for _ in range(3):
        sampler = DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True)  # built in the epoch loop
        finding = watch.iterated(sampler, "sampler", 0, LOOP, BUILT)
        found += [finding] if finding is not None else []
        orders.append(list(sampler))
    assert orders[0] == orders[1] == orders[2]  # the bug
    (finding,) = found
    assert "built again for this pass over the same dataset with the same seed (0)" in finding.message


def test_a_fresh_sampler_every_epoch_with_its_epoch_set_is_fine() -> None:
    watch = IterationWatch()
    for epoch in range(3):
        sampler = DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True)
        sampler.set_epoch(epoch)
        assert watch.iterated(sampler, "sampler", 1, LOOP, BUILT) is None


# ------------------------------------------------------------------------------ the patches themselves


def test_the_patches_come_off_and_a_failing_audit_never_stops_the_loop() -> None:
    originals = (DataLoader.__iter__, DistributedSampler.__init__, DistributedSampler.set_epoch)

    def report(finding: Finding) -> None:
        raise RuntimeError("a report that breaks")

    uninstall = install_loader_audits(report)
    try:
        assert active()
        sampler = DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True)
        loader = DataLoader(DATA, batch_size=4, sampler=sampler)
        passes = [
            [float(x) for (batch,) in loader for x in batch] for _ in range(3)
        ]  # reported, and it raised
    finally:
        uninstall()
    assert not active()
    assert (DataLoader.__iter__, DistributedSampler.__init__, DistributedSampler.set_epoch) == originals
    assert passes[0] == passes[1] == passes[2] and len(passes[0]) == 8


# ------------------------------------------------------------------------------ ranks and the summary


def test_a_finding_of_both_ranks_is_one_finding_listing_both(tmp_path: Path) -> None:
    files = RunDir(str(tmp_path))
    both = Finding(class_="sampler-epoch", message="the DistributedSampler built at a.py:3 ...",
                   severity=Severity.WARNING, locations=(Location("a.py", 9),))
    only_one = Finding(class_="init-module-scope", message="the dataloader's `generator` ...")
    (tmp_path / os.path.basename(files.findings(0, 4100))).write_text(dumps([both, only_one]))
    (tmp_path / os.path.basename(files.findings(1, 4101))).write_text(dumps([both]))

    merged = with_ranks([both, only_one], str(tmp_path))

    assert [f.facts.get("found_by_ranks") for f in merged] == [[0, 1], [0]]
    assert merged[0].locations == both.locations


def test_the_summary_prints_the_users_text_as_it_is(tmp_path: Path) -> None:
    finding = Finding(
        class_="sampler-epoch",
        message="metric [bold]loss[/bold] at [red]x",
        severity=Severity.WARNING,
        locations=(Location("/job/train.py", 7),),
        facts={"found_by_ranks": [0, 1]},
    )
    out = tmp_path / "summary.txt"
    with out.open("w") as stream:
        render_summary([finding], report_path="out/report.json", stream=stream)
    text = out.read_text()
    assert "ddpdoctor summary: 1 warning (all of it in out/report.json)" in text
    assert "[sampler-epoch] /job/train.py:7 (ranks 0, 1)" in text
    assert "metric [bold]loss[/bold] at [red]x" in text
