"""`ddpdoctor env` and the collector behind it, run for real: the command in a fresh process, real sockets,
real installed metadata (a fake distribution is a real .dist-info folder on the path)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from ddpdoctor.environment import (
    KnownBadError,
    check_rendezvous,
    distributed_variables,
    find_known_bad,
    known_bad_entries,
    parse_known_bad,
)

LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# For a test about another part of `env` (the rendezvous, the known-bad table, how values are printed): the
# torch probe gives up at once instead of importing torch in a child (4 CPU-seconds a call on this 2-core
# machine). What the probe reports is tested with the real import (test_env_json_reports_this_machine).
SKIP_TORCH = ("--torch-timeout", "0.01")


def run_env(*args: str, env: dict[str, str] | None = None, pythonpath: str | None = None):
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and not k.startswith("NCCL_")}
    full = {**base, "COLUMNS": "160", "NO_COLOR": "1", **(env or {})}
    if pythonpath:
        full["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "env", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
    )


@pytest.fixture
def listening_port():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.fixture
def closed_port():
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


# --- the knowledge base -------------------------------------------------------------------------------


def test_every_known_bad_entry_in_the_catalogue_parses():
    entries = known_bad_entries()
    packages = {p for e in entries for p in e.packages}
    assert {"lightning", "pytorch-lightning", "SwissArmyTransformer"} <= packages
    for entry in entries:
        assert entry.when and entry.message


@pytest.mark.parametrize(
    ("package", "version", "bad"),
    [
        ("lightning", "2.2.5", True),
        ("lightning", "2.3.3", True),
        ("lightning", "2.4.0", False),
        ("lightning", "2.6.6", False),
        ("pytorch_lightning", "2.2.0", True),  # the alias, spelled as the import name
        ("SwissArmyTransformer", "0.4.10", True),
        ("swissarmytransformer", "0.4.11", False),
        ("SwissArmyTransformer", "0.4.9", False),
        ("accelerate", "0.20.0", False),
    ],
)
def test_known_bad_versions(package, version, bad):
    hits = find_known_bad({package: version}, known_bad_entries())
    assert bool(hits) is bad
    if bad:
        assert hits[0].entry.class_slug == "backend-device-mismatch"
        assert hits[0].version == version


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"package": "x", "versions": "<<1", "when": "w", "message": "m"}, "PEP 440"),
        ({"package": "x", "packages": ["y"], "versions": "<1", "when": "w", "message": "m"}, "exactly one"),
        ({"packages": [], "versions": "<1", "when": "w", "message": "m"}, "non-empty list"),
        ({"package": "x", "versions": "<1", "message": "m"}, "`when`"),
        ({"package": "x", "versions": "<1", "when": "w", "message": "m", "severity": "high"}, "unknown key"),
        ("lightning<2.4", "must be a table"),
    ],
)
def test_malformed_known_bad_tables_are_rejected(raw, error):
    with pytest.raises(KnownBadError, match=error):
        parse_known_bad(raw, "backend-device-mismatch", "F1.toml")


# --- variables and the rendezvous check ------------------------------------------------------------------


def test_variables_are_picked_by_name_and_prefix():
    picked = distributed_variables(
        {"RANK": "1", "NCCL_DEBUG": "INFO", "TORCH_NCCL_BLOCKING_WAIT": "1", "HOME": "/root", "PATH": "/bin"}
    )
    assert picked == {"RANK": "1", "NCCL_DEBUG": "INFO", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_rendezvous_is_checked_only_when_both_are_set(listening_port):
    assert check_rendezvous({}) is None
    assert check_rendezvous({"MASTER_ADDR": "127.0.0.1"}) is None
    assert check_rendezvous({"MASTER_PORT": str(listening_port)}) is None
    assert check_rendezvous({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(listening_port)}).reachable


def test_rendezvous_refused_and_invalid(closed_port):
    refused = check_rendezvous({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(closed_port)})
    assert not refused.reachable and "refused" in refused.detail
    invalid = check_rendezvous({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"})
    assert not invalid.reachable and invalid.detail == "invalid port"


# --- the command
# ---------------------------------------------------------------------------------------------


def test_env_json_reports_this_machine(listening_port):
    result = run_env(
        "--format",
        "json",
        env={
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(listening_port),
            "RANK": "0",
            "WORLD_SIZE": "2",
            "NCCL_DEBUG": "INFO",
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        },
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    import torch

    assert data["torch"]["version"] == torch.__version__
    assert data["torch"]["cuda"] == torch.version.cuda
    assert data["torch"]["backends"]["gloo"] is True
    assert data["torch"]["distributed"] is True
    assert data["torch"]["import_seconds"] > 0
    assert len(data["torch"]["cuda_devices"]) == torch.cuda.device_count()
    versions = {p["name"]: p["version"] for p in data["packages"]}
    assert versions["lightning"] == importlib.metadata.version("lightning")
    assert versions["torchmetrics"] == importlib.metadata.version("torchmetrics")
    assert versions["SwissArmyTransformer"] is None
    assert data["variables"]["NCCL_DEBUG"] == "INFO"
    assert data["variables"]["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert data["rendezvous"]["reachable"] is True
    assert data["rendezvous"]["port"] == str(listening_port)
    assert data["known_bad"] == []


def test_env_text_says_when_the_rendezvous_is_unreachable(closed_port):
    result = run_env(*SKIP_TORCH,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(closed_port), "WORLD_SIZE": "2"})
    assert result.returncode == 0, result.stderr
    assert f"127.0.0.1:{closed_port}" in result.stdout
    assert "not reachable" in result.stdout
    # RANK is missing: the launcher variables are incomplete.
    assert "RANK not" in " ".join(result.stdout.split())
    assert "No known-bad versions installed" in result.stdout


def test_env_flags_an_installed_known_bad_version(tmp_path):
    # A real distribution record on the path, as `pip install SwissArmyTransformer==0.4.10` would leave.
    info = tmp_path / "SwissArmyTransformer-0.4.10.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: SwissArmyTransformer\nVersion: 0.4.10\n")
    result = run_env(*SKIP_TORCH, pythonpath=str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert "Known-bad versions installed" in text
    assert "SwissArmyTransformer 0.4.10" in text
    assert "backend-device-mismatch" in text
    assert "0.4.11" in text  # the fix

    as_json = json.loads(run_env("--format", "json", *SKIP_TORCH, pythonpath=str(tmp_path)).stdout)
    assert [(h["package"], h["version"], h["class"]) for h in as_json["known_bad"]] == [
        ("SwissArmyTransformer", "0.4.10", "backend-device-mismatch")
    ]


def test_env_gives_up_on_a_slow_torch_import():
    result = run_env("--format", "json", "--torch-timeout", "0.05")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["torch"]["installed"] is True
    assert "longer than 0.05 s" in data["torch"]["error"]
    assert "Traceback" not in result.stderr


def test_env_rejects_a_bad_timeout():
    result = run_env("--torch-timeout", "0")
    assert result.returncode == 2
    assert "--torch-timeout must be positive" in result.stderr


BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, sys
    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "torch":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, NoTorch())
    from ddpdoctor.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_env_without_torch():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, "env"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "COLUMNS": "160", "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "torch not installed" in " ".join(result.stdout.split())
    assert "lightning" in result.stdout  # the other libraries are still read from their metadata
    assert "Traceback" not in result.stderr


def test_values_from_the_machine_are_shown_as_they_are_not_as_rich_markup():
    """A variable's value is data: `[bold]` in it is printed, not read as a style (and `[/]` not an error)."""
    result = run_env(*SKIP_TORCH, env={"NCCL_SOCKET_IFNAME": "[bold]eth0[/]", "GLOO_SOCKET_IFNAME": "[eth1]"})
    assert result.returncode in (0, 1), result.stderr
    assert "[bold]eth0[/]" in result.stdout
    assert "[eth1]" in result.stdout
