"""`ddpdoctor check FILE` reads the project's own modules that FILE imports, and reports only in FILE."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpdoctor.check.local_imports import local_imports, project_root

TRAIN = """\
import torch.distributed as dist
from helpers import sync
from pkg import tools


def main():
    dist.init_process_group("nccl")
    if dist.get_rank() == 0:
        sync()
    tools.report()


main()
"""
HELPERS = """\
import torch.distributed as dist
from pkg.deeper import wait


def sync():
    wait()


def only_rank_zero():
    if dist.get_rank() == 0:
        dist.barrier()
"""
DEEPER = """\
import torch.distributed as dist


def wait():
    dist.barrier()
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    write(root, {
        "pyproject.toml": "",
        "train.py": TRAIN,
        "helpers.py": HELPERS,
        "pkg/__init__.py": "",
        "pkg/tools.py": "def report():\n    print('done')\n",
        "pkg/deeper.py": DEEPER,
        # Not imported by train.py: never read, its finding never reported.
        "unrelated.py": "import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n",
    })
    return root


def test_a_barrier_two_modules_away_is_reported_in_the_checked_file(check, tmp_path, monkeypatch):
    root = project(tmp_path)
    monkeypatch.chdir(root)
    outcome = check("train.py", "--isolated", "--format", "json", "--no-progress")
    assert [(f["path"], f["code"], f["line"]) for f in outcome.findings] == [("train.py", "DDP101", 9)]
    assert "`torch.distributed.barrier` (deeper.py:5)" in outcome.findings[0]["message"]
    # helpers.py's own rank-0 barrier is a finding of helpers.py, which was not asked about.
    assert "Read 4 local modules that the checked file imports" in outcome.err


def test_the_same_project_checked_whole_reports_every_file(check, tmp_path, monkeypatch):
    root = project(tmp_path)
    monkeypatch.chdir(root)
    outcome = check(".", "--isolated", "--format", "json", "--no-progress")
    # (pkg/deeper.py: the barrier that train.py reaches, reported at both ends)
    assert {(f["path"], f["line"]) for f in outcome.findings} == {
        ("train.py", 9), ("helpers.py", 11), ("unrelated.py", 3), ("pkg/deeper.py", 5)}
    assert "local module" not in outcome.err  # a directory is checked whole: nothing extra to read


def test_quiet_says_nothing_about_the_modules_it_read(check, tmp_path, monkeypatch):
    root = project(tmp_path)
    monkeypatch.chdir(root)
    outcome = check("train.py", "--isolated", "--quiet", "--no-progress")
    assert outcome.code == 1 and "local module" not in outcome.err


def test_the_modules_are_those_imported_transitively_under_the_project_root(tmp_path):
    root = project(tmp_path)
    found = local_imports([str(root / "train.py")], lambda path: False)
    assert sorted(Path(p).relative_to(root).as_posix() for p in found.modules) == [
        "helpers.py", "pkg/__init__.py", "pkg/deeper.py", "pkg/tools.py"]
    assert found.roots == (str(root),)


def test_modules_that_import_each_other_are_read_once(tmp_path):
    write(tmp_path, {
        "a.py": "import b\n",
        "b.py": "import a\nimport c\n",
        "c.py": "from . import b\n",
    })
    found = local_imports([str(tmp_path / "a.py")], lambda path: False)
    assert sorted(Path(p).name for p in found.modules) == ["b.py", "c.py"]


def test_the_root_is_the_nearest_folder_with_a_project_marker(tmp_path):
    write(tmp_path, {"repo/setup.cfg": "", "repo/src/app/main.py": "", "loose/script.py": ""})
    assert project_root(str(tmp_path / "repo/src/app/main.py")) == str(tmp_path / "repo")
    assert project_root(str(tmp_path / "loose/script.py")) == str(tmp_path / "loose")


def test_an_unparsable_module_is_left_to_the_engine(tmp_path):
    write(tmp_path, {"main.py": "import broken\n", "broken.py": "def (:\n"})
    found = local_imports([str(tmp_path / "main.py")], lambda path: False)
    assert [Path(p).name for p in found.modules] == ["broken.py"]
