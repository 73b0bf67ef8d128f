"""Reads `examples/<slug>/example.toml` (format: examples/README.md) and runs one example the way a user
would.

`ddpdoctor demo` and the example tests (tests/examples) share these reading and running rules, so the demo
shows exactly what the tests verify.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# The examples are package data (a checkout's top-level examples/ links here), so an installed wheel has them.
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LAUNCHERS = ("torchrun", "python")
DEVICES = ("any", "cpu", "cuda")
EXPECTATIONS = ("pass", "fail")
RUN_KEYS = {
    "name", "script", "launcher", "nproc", "device", "gpus", "expect", "output", "timeout", "env", "check",
    "guard", "explain",
}
TOP_KEYS = {"class", "summary", "needs_gpu", "run"}


class ManifestError(ValueError):
    """An example.toml that does not follow the format in examples/README.md."""


@dataclass(frozen=True)
class ExampleRun:
    example: str  # the folder name (= the class slug)
    name: str
    script: Path
    launcher: str
    nproc: int
    device: str
    gpus: int
    expect: str
    output: re.Pattern[str]
    timeout: float
    env: dict[str, str] = field(default_factory=dict)
    check: tuple[str, ...] | None = None  # rule codes `ddpdoctor check <script>` reports; None: not stated
    guard: str | None = None  # the class `ddpdoctor run` reports on this run; None: nothing to catch live
    explain: str | None = None  # the class `ddpdoctor explain` ranks first on this run's output

    @property
    def id(self) -> str:
        return f"{self.example}/{self.name}"

    def command(self) -> list[str]:
        if self.launcher == "python":
            return [sys.executable, str(self.script)]
        torchrun = Path(sys.executable).with_name("torchrun")
        launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
        # --standalone: a c10d rendezvous on localhost with a port the OS picks, so runs never collide.
        return [*launcher, "--standalone", f"--nproc-per-node={self.nproc}", str(self.script)]

    def guarded_command(self, hang_after: float, report_dir: Path) -> list[str]:
        """The same command under `ddpdoctor run`, as a user would type it."""
        return [
            sys.executable,
            "-m",
            "ddpdoctor",
            "run",
            "--hang-after",
            f"{hang_after:g}",
            "--report",
            str(report_dir),
            "--",
            *self.command(),
        ]

    def runnable_here(self, cuda_devices: int) -> bool:
        if self.device == "cuda":
            return cuda_devices >= self.gpus
        if self.device == "cpu":
            return cuda_devices == 0
        return True


@dataclass(frozen=True)
class Example:
    slug: str
    summary: str
    needs_gpu: bool
    folder: Path
    runs: tuple[ExampleRun, ...]


def load_example(folder: Path) -> Example:
    path = folder / "example.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from exc
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise ManifestError(f"{path}: unknown key(s) {sorted(unknown)}")
    if data.get("class") != folder.name:
        raise ManifestError(f"{path}: `class` must be the folder name {folder.name!r}")
    runs = data.get("run")
    if not isinstance(runs, list) or not runs:
        raise ManifestError(f"{path}: needs at least one [[run]]")
    parsed = tuple(_parse_run(folder, path, raw) for raw in runs)
    names = [r.name for r in parsed]
    if len(set(names)) != len(names):
        raise ManifestError(f"{path}: run names repeat: {names}")
    return Example(
        slug=folder.name,
        summary=str(data.get("summary", "")),
        needs_gpu=bool(data.get("needs_gpu", False)),
        folder=folder,
        runs=parsed,
    )


def _parse_run(folder: Path, path: Path, raw: dict) -> ExampleRun:
    unknown = set(raw) - RUN_KEYS
    if unknown:
        raise ManifestError(f"{path}: unknown run key(s) {sorted(unknown)}")
    script = folder / str(raw.get("script", ""))
    if not script.is_file():
        raise ManifestError(f"{path}: script {raw.get('script')!r} does not exist")
    launcher = raw.get("launcher", "python")
    device = raw.get("device", "any")
    expect = raw.get("expect")
    if launcher not in LAUNCHERS or device not in DEVICES or expect not in EXPECTATIONS:
        raise ManifestError(f"{path}: bad launcher/device/expect in run for {script.name}")
    if "output" not in raw:
        raise ManifestError(f"{path}: run for {script.name} has no `output` regex")
    env = raw.get("env", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ManifestError(f"{path}: `env` values must be strings")
    check = raw.get("check")
    if check is not None and (
        not isinstance(check, list)
        or not all(isinstance(c, str) and re.fullmatch(r"DDP\d{3}", c) for c in check)
    ):
        raise ManifestError(f"{path}: `check` must be a list of rule codes (DDPnnn)")
    for key in ("guard", "explain"):
        if key in raw and raw[key] not in _slugs():
            raise ManifestError(f"{path}: `{key}` must be a class slug of the catalogue, not {raw[key]!r}")
    if "guard" in raw and expect != "fail":
        raise ManifestError(
            f"{path}: `guard` belongs on a run that fails (the guard stays silent on the rest)"
        )
    return ExampleRun(
        example=folder.name,
        name=str(raw.get("name", script.stem)),
        script=script,
        launcher=launcher,
        nproc=int(raw.get("nproc", 1)),
        device=device,
        gpus=int(raw.get("gpus", 0)),
        expect=expect,
        output=re.compile(raw["output"], re.MULTILINE),
        timeout=float(raw.get("timeout", 90)),
        env=dict(env),
        check=None if check is None else tuple(check),
        guard=raw.get("guard"),
        explain=raw.get("explain"),
    )


def _slugs() -> set[str]:
    from ..catalogue import CATALOGUE

    return {failure.slug for failure in CATALOGUE}


def all_examples(folder: Path = EXAMPLES) -> list[Example]:
    return [load_example(p.parent) for p in sorted(folder.glob("*/example.toml"))]


@dataclass(frozen=True)
class RunResult:
    run: ExampleRun
    returncode: int | None  # None: killed at the timeout
    output: str
    seconds: float
    rerun: bool = False  # the first run passed but torch aborted in its exit-time cleanup (see below)

    def problems(self) -> list[str]:
        """What differs from the manifest's expectation; empty when the run behaved as documented."""
        found = []
        if self.returncode is None:
            found.append(f"still running after {self.run.timeout:.0f}s (killed)")
        elif self.run.expect == "pass" and self.returncode != 0:
            found.append(f"expected exit 0, got {self.returncode}")
        elif self.run.expect == "fail" and self.returncode == 0:
            found.append("expected a non-zero exit, got 0")
        if not self.run.output.search(self.output):
            found.append(f"output does not match {self.run.output.pattern!r}")
        return found


# Process groups of the runs in flight, so that an interrupted demo can stop them: each run has a session of
# its own, which a Ctrl-C or SIGTERM sent to the demo does not reach.
_RUNNING: set[int] = set()
_RUNNING_LOCK = threading.Lock()


def stop_all_runs() -> None:
    """Kill every example run still going, with everything it started."""
    with _RUNNING_LOCK:
        pgids = list(_RUNNING)
    for pgid in pgids:
        _kill_group(pgid)


# torch 2.13 (CPU, gloo) sometimes aborts a rank after its script has finished, in the interpreter's exit-time
# cleanup: "terminate called without an active exception", SIGABRT, no Python frame on the stack (seen
# here in 2 of 30 and 2 of 40 runs of a small DDP job, with or without the guard, after
# `destroy_process_group()`, and as often with the DDP model deleted first). A run that was meant to pass,
# printed what proves it, and failed only that way is run again, up to TEARDOWN_RERUNS times: the abort is
# torch's, not the example's, and a real failure repeats. (Twice in a row happened in a CI run.)
TEARDOWN_ABORT = "terminate called without an active exception"
TEARDOWN_RERUNS = 3


def aborted_in_teardown(returncode: int | None, output: str, proof: str | re.Pattern[str]) -> bool:
    """Failed only of torch's exit-time abort, after printing `proof` (text or pattern) of its work."""
    printed = proof.search(output) is not None if isinstance(proof, re.Pattern) else proof in output
    return returncode not in (0, None) and TEARDOWN_ABORT in output and printed


def run_example(run: ExampleRun, cwd: Path, command: list[str] | None = None) -> RunResult:
    """Run in its own session so that the launcher and every rank it started can be killed together.

    `command` replaces the run's own (the demo passes the guarded form of it)."""
    result = _run_once(run, cwd, command)
    seconds = result.seconds
    for _ in range(TEARDOWN_RERUNS):
        if run.expect != "pass" or not aborted_in_teardown(result.returncode, result.output, run.output):
            break
        again = _run_once(run, cwd, command)
        seconds += again.seconds
        result = RunResult(run, again.returncode, again.output, seconds, rerun=True)
    return result


def _run_once(run: ExampleRun, cwd: Path, command: list[str] | None) -> RunResult:
    env = {**os.environ, **run.env, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        command or run.command(),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    with _RUNNING_LOCK:
        _RUNNING.add(proc.pid)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=run.timeout)
    except subprocess.TimeoutExpired:
        # Either the launcher itself or a rank it left behind (holding the pipe open) outlived the limit.
        timed_out = True
    finally:
        _kill_group(proc.pid)
        with _RUNNING_LOCK:
            _RUNNING.discard(proc.pid)
    if timed_out:
        out, _ = proc.communicate()
    code = None if timed_out else proc.returncode
    return RunResult(run, code, out or "", time.monotonic() - started)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cuda_device_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count()
