"""F10 checkpoint-race under `ddpdoctor run` with no code change: plain torch under torchrun, Lightning
under `python`, accelerate under `accelerate launch` (the jobs in jobs/runtime/, broken and fixed); and
the pieces of the judgement on their own (mount table, the store's entries, the finding's words)."""

from __future__ import annotations

import os

import pytest
from runtime_jobs import LANE, line_of, run

from ddpdoctor.audits.checkpoints import (
    PendingReport,
    Write,
    distinct_writers,
    install_checkpoint_audit,
    is_reporter,
    race_finding,
    target_path,
)
from ddpdoctor.audits.context import AuditStore
from ddpdoctor.audits.mounts import mount_of, parse_mounts
from ddpdoctor.findings import Finding, Severity

pytestmark = pytest.mark.xdist_group(LANE)

# what each broken job writes from every rank: file -> (writer, the marker of the line that writes it)
RACES = {
    "torch": {"init.pt": ("torch.save", "every rank saves")},
    "lightning": {
        "init.pt": ("torch.save", "every rank saves"),
        "init.ckpt": ("Lightning TorchCheckpointIO", "every rank io"),
    },
    "accelerate": {"model.safetensors": ("safetensors save_file", "every rank saves")},
}
# what each fixed job writes: once, or once per rank under its own name
WRITTEN = {
    "torch": ["init.pt", "last.pt", "optimizer-rank0.pt", "optimizer-rank1.pt"],
    "lightning": ["init.pt", "last.ckpt"],
    "accelerate": ["model.safetensors", "state/random_states_0.pkl", "state/random_states_1.pkl"],
}


@pytest.mark.parametrize("framework", sorted(RACES))
def test_ranks_writing_one_file_are_one_warning_naming_the_path_the_ranks_and_the_line(
    framework: str,
) -> None:
    job = run(framework, "broken")
    races = job.of_class("checkpoint-race")
    expected = {os.path.realpath(job.out_dir / name): spec for name, spec in RACES[framework].items()}
    assert sorted(f.facts["path"] for f in races) == sorted(expected), job.output[-3000:]
    for finding in races:
        writer, marker = expected[finding.facts["path"]]
        assert finding.severity is Severity.WARNING
        assert finding.facts["writer_ranks"] == [0, 1]
        assert finding.facts["writers"] == [writer]
        assert f"ranks 0 and 1 write `{finding.facts['path']}`" in finding.message
        assert {(loc.path, loc.line, loc.rank) for loc in finding.locations} == {
            (str(job.script), line_of(job.script, marker), rank) for rank in (0, 1)
        }
        # printed once, by the one rank that judged it
        printed = [line for line in job.output.splitlines()
                   if line.startswith("[ddpdoctor] warning") and f"`{finding.facts['path']}`" in line]
        assert len(printed) == 1, printed


@pytest.mark.parametrize("framework", sorted(WRITTEN))
def test_one_writer_or_a_file_per_rank_is_fine(framework: str) -> None:
    job = run(framework, "fixed")
    assert job.returncode == 0, job.output[-3000:]
    assert job.findings == []
    assert "[ddpdoctor] warning" not in job.output
    for name in WRITTEN[framework]:
        assert (job.out_dir / name).stat().st_size > 0, name


# ------------------------------------------------------------------------------------------ the pieces


def test_mount_table_names_network_filesystems_shared_and_local_ones_not() -> None:
    mounts = parse_mounts(
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /mnt/ckpt nfs4 rw 0 0\n"
        "lustre@tcp:/fs /lustre lustre rw 0 0\n"
        "sshfs#host: /mnt/my\\040disk fuse.sshfs rw 0 0\n"
        "tmpfs /mnt/ckpt/tmp tmpfs rw 0 0\n"
    )
    assert mount_of("/home/u/last.pt", mounts).fstype == "ext4"  # type: ignore[union-attr]
    assert mount_of("/mnt/ckpt/run1/last.pt", mounts).shared  # type: ignore[union-attr]
    assert mount_of("/lustre/x.pt", mounts).shared  # type: ignore[union-attr]
    assert mount_of("/mnt/my disk/x.pt", mounts).shared  # type: ignore[union-attr]
    assert not mount_of("/mnt/ckpt/tmp/x.pt", mounts).shared  # type: ignore[union-attr]  # the deeper mount
    assert mount_of("/mnt/ckptX/x.pt", mounts).point == "/"  # type: ignore[union-attr]  # a prefix, not a parent


def test_the_second_distinct_writer_reports_whatever_the_order() -> None:
    w = [Write(rank, "h", "torch.save") for rank in (3, 3, 1, 0)]
    assert [x.rank for x in distinct_writers(w)] == [3, 1, 0]
    assert is_reporter(w[:3], 1)  # rank 1 came second
    assert not is_reporter(w[:3], 3)  # the first writer, writing twice, is not a race with itself
    assert not is_reporter(w[:2], 3)
    assert not is_reporter(w, 0)  # a third writer is named in the second's report


def test_buffers_open_files_and_object_storage_are_not_file_writes() -> None:
    assert target_path("ckpt/last.pt") == "ckpt/last.pt"
    assert target_path("file:///ckpt/last.pt") == "/ckpt/last.pt"
    assert target_path("s3://bucket/last.pt") is None
    assert target_path(object()) is None


def test_writers_on_two_hosts_on_a_shared_filesystem_are_reported_hedged() -> None:
    mount = parse_mounts("server:/export /mnt/ckpt nfs4 rw 0 0\n")[0]
    writes = [
        Write(0, "node-a", "torch.save", "/src/train.py", 40),
        Write(8, "node-b", "torch.save", "/src/train.py", 40),
    ]
    finding = race_finding(PendingReport("k", "/mnt/ckpt/last.pt", mount, 12, writes[1]), writes)
    assert "ranks 0 and 8 write `/mnt/ckpt/last.pt`" in finding.message
    assert (
        "nfs4 mount (/mnt/ckpt) from hosts node-a, node-b: if these hosts mount the same export"
        in finding.message
    )
    assert finding.facts["shared_filesystem"] is True
    assert [loc.rank for loc in finding.locations] == [0, 8]


class NoJob:
    """An `AuditContext` outside a job: no store, so no save is judged."""

    def report(self, finding: Finding) -> None:
        raise AssertionError(f"nothing to report outside a job: {finding.message}")

    def store(self, namespace: str, timeout_s: float | None = None) -> AuditStore | None:
        return None

    def sequence(self) -> int:
        return 0


def test_uninstalling_puts_torch_save_back() -> None:
    import torch

    before = torch.save
    remove = install_checkpoint_audit(NoJob())
    assert torch.save is not before and torch.save.__wrapped__ is before  # type: ignore[attr-defined]
    remove()
    assert torch.save is before and torch.serialization.save is before
