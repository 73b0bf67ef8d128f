"""Other projects' distributed test suites, each run plain and under `ddpdoctor run`, on 2 gloo ranks: the
guard must not change a result, and must find nothing in a correct program.

    .venv/bin/python benchmarks/peer_suites.py [--only torch|accelerate] [--torch-tests K]

- torch: a subset of `DistributedTest` (torch.testing._internal.distributed), through the driver torch's
  own `test_distributed_spawn.py` uses, with pytest; among them the tests that provoke errors on purpose
  (a rank skipping `monitored_barrier`). Compared per test: passed, failed or skipped.
- accelerate: the test scripts accelerate ships (`accelerate/test_utils/scripts/`), each under torchrun.
  A script that passes plain must pass guarded with no finding; one that fails plain (a GPU-only script on
  a CPU machine) must fail alike, and a finding must never name a CUDA device on a machine without one.

Exits 1 on any change of result or unexpected finding, and prints a table (docs/precision.md has one).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PYTHON = sys.executable
# The subset: collectives, groups, DDP, object collectives, and the tests that provoke errors on purpose.
TORCH_TESTS = (
    "test_all_reduce_sum or test_all_reduce_max or test_broadcast_group or test_all_gather_group "
    "or test_reduce_sum or test_scatter or test_gather or test_barrier_group or test_all_to_all_group "
    "or test_monitored_barrier_gloo or test_monitored_barrier_gloo_subgroup "
    "or test_monitored_barrier_failure_order or test_monitored_barrier_wait_all_ranks "
    "or test_monitored_barrier_gloo_rank_0_timeout "
    "or test_broadcast_object_list or test_all_gather_object_default_pg or test_gather_object "
    "or test_DistributedDataParallel_SyncBatchNorm_Single_Input_Per_Process "
    "or test_ddp_logging_data_cpu or test_ddp_unused_params_rebuild_buckets_exception "
    "or test_ddp_sync_bn_training_vs_eval or test_new_subgroups or test_isend"
)
# A script whose plain run is not a correct program on this machine, and why (its result is still compared)
ACCELERATE_KNOWN = {
    "test_distributed_data_loop.py": "deadlocks on CPU, plain (the guard's collective-divergence is true)",
}
ACCELERATE_SKIP = {"test_cli.py", "test_notebook.py", "test_merge_weights.py"}  # no distributed job


@dataclass
class Outcome:
    name: str
    plain: str
    guarded: str
    findings: list[str]
    note: str = ""

    @property
    def ok(self) -> bool:
        if self.plain != self.guarded or self.name.endswith("(no test ran)"):
            return False
        cuda_named = any("cuda" in f for f in self.findings) and not _has_cuda()
        if cuda_named:
            return False
        return self.plain not in ("passed", "?") or not self.findings or bool(self.note)


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(command: list[str], env: dict[str, str], timeout: float, cwd: str | None = None) -> tuple[int, str]:
    try:
        done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False, start_new_session=True)
    except subprocess.TimeoutExpired as expired:
        return 124, (expired.stdout or b"").decode(errors="replace")
    return done.returncode, done.stdout.decode(errors="replace")


def guarded(command: list[str], report: Path) -> list[str]:
    return [PYTHON, "-m", "ddpdoctor", "run", "--report", str(report), "--", *command]


def findings_in(report: Path) -> list[str]:
    try:
        items = json.loads((report / "report.json").read_text())
    except (OSError, ValueError):
        return []
    return [f"{item.get('class', '?')}: {item.get('message', '')}" for item in items]


# ---------------------------------------------------------------------------------------------- torch
DRIVER = """\
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
"""


def torch_results(output: str) -> dict[str, str]:
    found = re.findall(r"^(PASSED|FAILED|SKIPPED|ERROR)\s.*?::(test_\w+)", output, re.M)
    return {name: verdict.lower() for verdict, name in found}


def torch_suite(tmp: Path, tests: str) -> list[Outcome]:
    try:
        import expecttest  # noqa: F401 - torch's test utilities import it
    except ImportError:
        raise SystemExit("torch's DistributedTest needs `expecttest`: pip install expecttest") from None
    driver = tmp / "test_distributed_gloo.py"
    driver.write_text(DRIVER)
    outcomes: dict[str, dict[str, str]] = {}
    reports = tmp / "torch-report"
    for mode in ("plain", "guarded"):
        temp_dir = tmp / f"torch-{mode}"
        temp_dir.mkdir()
        env = {**os.environ, "BACKEND": "gloo", "WORLD_SIZE": "2", "TEMP_DIR": str(temp_dir),
               "OMP_NUM_THREADS": "1"}
        command = [PYTHON, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(driver), "-k", tests]
        rc, output = run(guarded(command, reports) if mode == "guarded" else command, env, timeout=3600)
        for name, verdict in torch_results(output).items():
            outcomes.setdefault(name, {})[mode] = verdict
        if not torch_results(output):
            print(f"torch {mode}: no results (exit {rc})\n{output[-3000:]}", file=sys.stderr)
            outcomes.setdefault("(no test ran)", {})[mode] = f"exit {rc}"
    # one guarded session: its findings are the session's (report.json keeps every job's)
    return [Outcome(f"torch {name}", seen.get("plain", "?"), seen.get("guarded", "?"), [])
            for name, seen in sorted(outcomes.items())] + [
        Outcome("torch (the guarded session's findings)", "-", "-", findings_in(reports),
                note="reported, not stopped")
    ]


# ----------------------------------------------------------------------------------------- accelerate
def accelerate_suite(tmp: Path) -> list[Outcome]:
    import accelerate

    scripts = Path(accelerate.__file__).parent / "test_utils" / "scripts"
    outcomes = []
    for script in sorted(scripts.glob("test_*.py")):
        if script.name in ACCELERATE_SKIP:
            continue
        results = {}
        report = tmp / f"accelerate-{script.stem}"
        for mode in ("plain", "guarded"):
            command = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                       f"--master-port={free_port()}", str(script)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
            timeout = 120 if script.name in ACCELERATE_KNOWN else 900
            rc, _ = run(guarded(command, report) if mode == "guarded" else command, env, timeout=timeout)
            results[mode] = "passed" if rc == 0 else ("timeout" if rc == 124 else "failed")
        if results["plain"] == "timeout" and results["guarded"] == "failed":
            results["plain"] = "failed"  # the guard ends the deadlock the plain run waits out
        outcomes.append(Outcome(f"accelerate {script.name}", results["plain"], results["guarded"],
                                findings_in(report), ACCELERATE_KNOWN.get(script.name, "")))
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=("torch", "accelerate"))
    parser.add_argument("--torch-tests", default=TORCH_TESTS, help="pytest -k expression of DistributedTest")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        outcomes = []
        if args.only in (None, "torch"):
            outcomes += torch_suite(tmp, args.torch_tests)
        if args.only in (None, "accelerate"):
            outcomes += accelerate_suite(tmp)
    print("| test | plain | guarded | findings | same |\n|---|---|---|---|---|")
    for o in outcomes:
        found = "; ".join(f[:140] for f in o.findings) or "none"
        print(f"| {o.name} | {o.plain} | {o.guarded} | {found}{' (' + o.note + ')' if o.note else ''} | "
              f"{'yes' if o.ok else 'NO'} |")
    bad = [o.name for o in outcomes if not o.ok]
    print(f"{len(outcomes) - len(bad)}/{len(outcomes)} as expected in {time.monotonic() - started:.0f} s"
          + (f"; changed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
