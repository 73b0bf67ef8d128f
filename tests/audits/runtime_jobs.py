"""The runtime audits' jobs (tests/audits/jobs/runtime/), run as a user runs them: under `ddpdoctor run`
with `--report`, two gloo ranks on the CPU, no callback and no code change. Each (framework, variant) runs
once per test session; the F10 and F3 tests read the same run, and the fixed torch and accelerate jobs also
run the loader audits' fixed loops (tests/audits/test_runtime_loaders.py reads those runs)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ports import free_port
from processes import TOKEN_VARIABLE, run_in_session

from ddpdoctor.demo.manifest import TEARDOWN_RERUNS, aborted_in_teardown
from ddpdoctor.findings import Finding, loads

JOBS = Path(__file__).parent / "jobs" / "runtime"
BIN = Path(sys.executable).parent
# The modules that read these runs mark themselves with it: one lane makes each run once (tests/lanes.py)
LANE = "runtime-audit-jobs"
SCRIPTS = {"torch": "torch_job.py", "lightning": "lightning_job.py", "accelerate": "accelerate_job.py"}


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    findings: list[Finding]
    out_dir: Path  # where the job wrote its checkpoints
    script: Path

    def of_class(self, slug: str) -> list[Finding]:
        return [f for f in self.findings if f.class_ == slug]


def line_of(script: Path, marker: str) -> int:
    """The line of a job script marked `# line: <marker>` (tests do not hard-code numbers)."""
    lines = script.read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if f"# line: {marker}" in text)


def _installed_command(how: str, variant: str, out_dir: Path, report: Path) -> list[str]:
    """The Lightning job with the guard installed by the program (`install`) or its callback (`callback`),
    no `ddpdoctor run` around it."""
    return [sys.executable, str(JOBS / SCRIPTS["lightning"]), str(out_dir), variant, how, str(report)]


def _command(framework: str, variant: str, out_dir: Path, report: Path) -> list[str]:
    script = str(JOBS / SCRIPTS[framework])
    port = str(free_port())
    launch = {
        "torch": [
            str(BIN / "torchrun"),
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
        ],
        "lightning": [sys.executable],
        "accelerate": [
            str(BIN / "accelerate"),
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            port,
        ],
    }[framework]
    # a fixed job runs under --strict, as tests/audits/test_runtime_loaders.py ran its fixed loaders (which
    # these jobs now run too): a warning would make its exit code 1, not only its report
    strict = ["--strict"] if variant == "fixed" else []
    return [sys.executable, "-m", "ddpdoctor", "run", "--report", str(report), *strict, "--",
            *launch, script, str(out_dir), variant]


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k == TOKEN_VARIABLE or not k.startswith(("DDPDOCTOR_", "MASTER_", "TORCHELASTIC", "ACCELERATE_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), ACCELERATE_DISABLE_RICH="1")
    return env


_scratch = tempfile.mkdtemp(prefix="ddpdoctor-runtime-audits-")


def run(framework: str, variant: str, how: str = "run") -> Run:
    """The job's one run, however the call spells its arguments (`run("lightning", "broken")` and
    `run("lightning", "broken", "run")` are one job: functools.cache keys them apart)."""
    return _run(framework, variant, how)


@functools.cache
def _run(framework: str, variant: str, how: str) -> Run:
    """Run the job once; a fixed run that printed its last line and then died only of torch's exit-time
    abort is run again (see ddpdoctor.demo.manifest.TEARDOWN_ABORT). `how` the guard gets in: `run`
    (`ddpdoctor run`, every framework), `install` or `callback` (Lightning's job only)."""
    for attempt in range(TEARDOWN_RERUNS + 1):
        base = Path(_scratch) / f"{framework}-{variant}-{how}-{attempt}"
        out_dir, report = base / "out", base / "report"
        out_dir.mkdir(parents=True)
        report.mkdir()
        command = (_command(framework, variant, out_dir, report) if how == "run"
                   else _installed_command(how, variant, out_dir, report))
        # a fixed job also runs the loader audits' loops: ~40 s of wall at load 7, more room than a broken one
        timeout = 110 if variant == "fixed" else 90
        done = run_in_session(command, timeout=timeout, env=_env(), cwd=base, stop_gently=True)
        if variant == "broken" or not aborted_in_teardown(done.returncode, done.stdout, "done"):
            break
    path = report / "report.json"
    findings = loads(path.read_text()) if path.exists() else []
    return Run(done.returncode, done.stdout, findings, out_dir, JOBS / SCRIPTS[framework])


atexit.register(shutil.rmtree, _scratch, ignore_errors=True)
