"""What `ddpdoctor env` reports: versions, backends, devices, variables, rendezvous reachability, known-bad
combinations. Pure data; rendering lives in `commands/env.py`.

torch is never imported here at module level, nor in this process at all: `probe_torch()` runs in a child
interpreter with a time limit, because importing torch takes seconds and initialising CUDA can hang on a
broken driver. Every other package is looked up by its installed metadata, without importing it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# Distribution names as importlib.metadata knows them, in the order they are shown.
PACKAGES = (
    "lightning",
    "pytorch-lightning",
    "accelerate",
    "bitsandbytes",
    "transformers",
    "peft",
    "deepspeed",
    "SwissArmyTransformer",
    "torchmetrics",
)
VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_CPP_LOG_LEVEL",
    "TORCH_SHOW_CPP_STACKTRACES",
)
VARIABLE_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCHELASTIC_")
CONNECT_TIMEOUT_S = 1.0
TORCH_PROBE_TIMEOUT_S = 60.0


class KnownBadError(ValueError):
    """A `[[known_bad]]` table in a catalogue data file that does not follow the schema."""


@dataclass(frozen=True)
class KnownBad:
    """A package version range that is known to break distributed training in some situation.

    Schema of a `[[known_bad]]` table in `catalogue/data/<id>-<slug>.toml`:
      packages = ["lightning", "pytorch-lightning"]   # distribution names (or `package = "..."`)
      versions = "<2.4.0"                             # PEP 440 specifier set
      when = "..."                                    # the situation in which it breaks
      message = "..."                                 # what happens
      fix = "..."                                     # optional: what to do
      references = ["https://..."]                    # optional
    """

    class_slug: str
    packages: tuple[str, ...]
    versions: str
    when: str
    message: str
    fix: str = ""
    references: tuple[str, ...] = ()

    def matches(self, version: str) -> bool:
        try:
            return Version(version) in SpecifierSet(self.versions, prereleases=True)
        except InvalidVersion:
            return False


def parse_known_bad(raw: Any, class_slug: str, source: str = "") -> KnownBad:
    where = f"{source or class_slug}: [[known_bad]]"
    if not isinstance(raw, Mapping):
        raise KnownBadError(f"{where} must be a table")
    allowed = {"package", "packages", "versions", "when", "message", "fix", "references"}
    unknown = set(raw) - allowed
    if unknown:
        raise KnownBadError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if ("package" in raw) == ("packages" in raw):
        raise KnownBadError(f"{where}: give exactly one of `package` or `packages`")
    packages = [raw["package"]] if "package" in raw else raw["packages"]
    if not isinstance(packages, list) or not packages or not all(isinstance(p, str) and p for p in packages):
        raise KnownBadError(f"{where}: `packages` must be a non-empty list of distribution names")
    for key in ("versions", "when", "message"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise KnownBadError(f"{where}: `{key}` must be a non-empty string")
    try:
        SpecifierSet(raw["versions"])
    except InvalidSpecifier as exc:
        raise KnownBadError(f"{where}: `versions` {raw['versions']!r} is not a PEP 440 specifier") from exc
    references = raw.get("references", [])
    if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
        raise KnownBadError(f"{where}: `references` must be a list of strings")
    if not isinstance(raw.get("fix", ""), str):
        raise KnownBadError(f"{where}: `fix` must be a string")
    return KnownBad(
        class_slug=class_slug,
        packages=tuple(packages),
        versions=raw["versions"],
        when=" ".join(raw["when"].split()),
        message=" ".join(raw["message"].split()),
        fix=" ".join(raw.get("fix", "").split()),
        references=tuple(references),
    )


def known_bad_entries(catalogue: Iterable[Any] | None = None) -> list[KnownBad]:
    """Every `[[known_bad]]` table of the catalogue, validated (a malformed one raises `KnownBadError`)."""
    if catalogue is None:
        from .catalogue import CATALOGUE

        catalogue = CATALOGUE
    entries: list[KnownBad] = []
    for cls in catalogue:
        raw = cls.extra.get("known_bad", [])
        if not isinstance(raw, list):
            raise KnownBadError(f"{cls.source}: `known_bad` must be an array of tables ([[known_bad]])")
        entries.extend(parse_known_bad(item, cls.slug, cls.source) for item in raw)
    return entries


@dataclass(frozen=True)
class PackageVersion:
    name: str
    version: str | None  # None: not installed


@dataclass(frozen=True)
class KnownBadHit:
    entry: KnownBad
    package: str
    version: str


@dataclass
class TorchInfo:
    installed: bool
    version: str | None = None
    cuda: str | None = None  # the CUDA version torch was built with (None: a CPU build)
    nccl: str | None = None
    debug_build: bool | None = None
    distributed: bool | None = None
    backends: dict[str, bool] = field(default_factory=dict)
    cuda_devices: list[str] = field(default_factory=list)
    mps: bool | None = None
    import_seconds: float | None = None
    error: str | None = None  # torch is present but could not be probed (crash, timeout)


@dataclass(frozen=True)
class Rendezvous:
    address: str
    port: str
    reachable: bool
    detail: str  # "connected in 3 ms", "connection refused", "invalid port"


@dataclass
class Environment:
    python: str
    implementation: str
    executable: str
    platform: str
    torch: TorchInfo
    packages: list[PackageVersion]
    variables: dict[str, str]
    rendezvous: Rendezvous | None
    known_bad: list[KnownBadHit]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["known_bad"] = [
            {
                "class": hit.entry.class_slug,
                "package": hit.package,
                "version": hit.version,
                "versions": hit.entry.versions,
                "when": hit.entry.when,
                "message": hit.entry.message,
                "fix": hit.entry.fix,
                "references": list(hit.entry.references),
            }
            for hit in self.known_bad
        ]
        return data


def package_versions(names: Iterable[str] = PACKAGES) -> list[PackageVersion]:
    found = []
    for name in names:
        try:
            version: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        found.append(PackageVersion(name, version))
    return found


def find_known_bad(versions: Mapping[str, str | None], entries: Iterable[KnownBad]) -> list[KnownBadHit]:
    """Entries whose package is installed in a listed version. `versions` maps distribution name ->
    version."""
    normalised = {_normalise(name): version for name, version in versions.items() if version}
    hits = []
    for entry in entries:
        for package in entry.packages:
            version = normalised.get(_normalise(package))
            if version is not None and entry.matches(version):
                hits.append(KnownBadHit(entry, package, version))
    return hits


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def distributed_variables(environ: Mapping[str, str]) -> dict[str, str]:
    picked = {name: environ[name] for name in VARIABLES if name in environ}
    for name in sorted(environ):
        if name.startswith(VARIABLE_PREFIXES) and name not in picked:
            picked[name] = environ[name]
    return picked


def check_rendezvous(environ: Mapping[str, str], timeout: float = CONNECT_TIMEOUT_S) -> Rendezvous | None:
    """Connect to MASTER_ADDR:MASTER_PORT, and only there, when the user set both."""
    address, port_text = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if not address or not port_text:
        return None
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        return Rendezvous(address, port_text, False, "invalid port")
    started = time.monotonic()
    try:
        with socket.create_connection((address, port), timeout=timeout):
            pass
    except TimeoutError:
        return Rendezvous(address, port_text, False, f"no answer within {timeout:g} s")
    except socket.gaierror as exc:
        return Rendezvous(address, port_text, False, f"cannot resolve {address!r}: {exc.strerror or exc}")
    except OSError as exc:
        return Rendezvous(address, port_text, False, (exc.strerror or str(exc)).lower())
    elapsed = (time.monotonic() - started) * 1000
    return Rendezvous(address, port_text, True, f"connected in {elapsed:.0f} ms")


def torch_importable() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def probe_torch(timeout: float = TORCH_PROBE_TIMEOUT_S) -> TorchInfo:
    """Ask a child interpreter what torch can do here; a hang or a crash there is reported, not inherited."""
    if not torch_importable():
        return TorchInfo(installed=False)
    code = "import json, ddpdoctor.environment as e; print(json.dumps(e.torch_facts()))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return TorchInfo(installed=True, error=f"importing torch took longer than {timeout:g} s (stopped)")
    except OSError as exc:
        return TorchInfo(installed=True, error=f"could not start {sys.executable}: {exc}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return TorchInfo(installed=True, error=f"probing torch failed: {last}")
    try:
        return TorchInfo(**json.loads(lines[-1]))
    except (ValueError, TypeError) as exc:
        return TorchInfo(installed=True, error=f"probing torch failed: {exc}")


def torch_facts() -> dict[str, Any]:
    """Runs in the probe's child process: import torch and describe it."""
    started = time.monotonic()
    import torch

    facts: dict[str, Any] = {"installed": True, "import_seconds": round(time.monotonic() - started, 3)}
    facts["version"] = str(torch.__version__)
    facts["cuda"] = torch.version.cuda
    facts["debug_build"] = bool(torch.version.debug)
    facts["distributed"] = bool(torch.distributed.is_available())
    if facts["distributed"]:
        import torch.distributed as dist

        checks = {
            "gloo": "is_gloo_available",
            "nccl": "is_nccl_available",
            "mpi": "is_mpi_available",
            "ucc": "is_ucc_available",
            "xccl": "is_xccl_available",
        }
        facts["backends"] = {
            name: bool(getattr(dist, fn)()) for name, fn in checks.items() if hasattr(dist, fn)
        }
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        facts["cuda_devices"] = [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(count)]
    if facts["cuda"] is not None:
        try:
            nccl = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:  # a CUDA build without NCCL (Windows) or a broken driver: report it as absent
            facts["nccl"] = None
    mps = getattr(torch.backends, "mps", None)
    facts["mps"] = bool(mps.is_available()) if mps is not None else None
    return facts


def consistency_notes(variables: Mapping[str, str], torch: TorchInfo) -> list[str]:
    """Launcher variables that contradict each other or the machine (`process-group-missing` territory)."""
    notes = []
    present = [name for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if name in variables]
    if present and len(present) < 4:
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if n not in variables]
        notes.append(
            f"{', '.join(present)} set but {', '.join(missing)} not: "
            "init_process_group(init_method='env://') "
            "needs all four (torchrun sets them)"
        )
    rank, world = _int(variables.get("RANK")), _int(variables.get("WORLD_SIZE"))
    if rank is not None and world is not None and not 0 <= rank < world:
        notes.append(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    local_rank = _int(variables.get("LOCAL_RANK"))
    if local_rank is not None and torch.cuda_devices and local_rank >= len(torch.cuda_devices):
        notes.append(f"LOCAL_RANK={local_rank} but only {len(torch.cuda_devices)} CUDA device(s) are visible")
    if variables.get("CUDA_VISIBLE_DEVICES", None) == "":
        notes.append("CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible to this process")
    if torch.installed and torch.backends and not torch.backends.get("nccl") and torch.cuda_devices:
        notes.append("CUDA devices are visible but this torch build has no NCCL: use the gloo backend")
    return notes


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def collect(
    environ: Mapping[str, str] | None = None,
    torch_timeout: float = TORCH_PROBE_TIMEOUT_S,
    entries: Iterable[KnownBad] | None = None,
) -> Environment:
    environ = os.environ if environ is None else environ
    torch = probe_torch(torch_timeout)
    packages = package_versions()
    variables = distributed_variables(environ)
    versions: dict[str, str | None] = {p.name: p.version for p in packages}
    if torch.version:
        versions["torch"] = torch.version.split("+")[0]
    hits = find_known_bad(versions, known_bad_entries() if entries is None else entries)
    return Environment(
        python=platform.python_version(),
        implementation=platform.python_implementation(),
        executable=sys.executable,
        platform=platform.platform(),
        torch=torch,
        packages=packages,
        variables=variables,
        rendezvous=check_rendezvous(environ),
        known_bad=hits,
        notes=consistency_notes(variables, torch),
    )
