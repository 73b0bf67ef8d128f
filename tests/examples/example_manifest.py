"""Reads `examples/<slug>/example.toml` (format: examples/README.md) and runs one example the way a user would.

Kept free of pytest so that the demo can reuse the same reading and running rules.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LAUNCHERS = ("torchrun", "python")
DEVICES = ("any", "cpu", "cuda")
EXPECTATIONS = ("pass", "fail")
RUN_KEYS = {"name", "script", "launcher", "nproc", "device", "gpus", "expect", "output", "timeout", "env", "check"}
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
        not isinstance(check, list) or not all(isinstance(c, str) and re.fullmatch(r"DDP\d{3}", c) for c in check)
    ):
        raise ManifestError(f"{path}: `check` must be a list of rule codes (DDPnnn)")
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
    )


def all_examples() -> list[Example]:
    return [load_example(p.parent) for p in sorted(EXAMPLES.glob("*/example.toml"))]


@dataclass(frozen=True)
class RunResult:
    run: ExampleRun
    returncode: int | None  # None: killed at the timeout
    output: str
    seconds: float

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


def run_example(run: ExampleRun, cwd: Path) -> RunResult:
    """Run in its own session so that the launcher and every rank it started can be killed together."""
    env = {**os.environ, **run.env, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        run.command(),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=run.timeout)
    except subprocess.TimeoutExpired:
        # Either the launcher itself or a rank it left behind (holding the pipe open) outlived the limit.
        timed_out = True
    finally:
        _kill_group(proc)
    if timed_out:
        out, _ = proc.communicate()
    code = None if timed_out else proc.returncode
    return RunResult(run, code, out or "", time.monotonic() - started)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cuda_device_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count()
