"""What DDP601 tells the user about each kind of shared write (check/writes.py): a folder made after a check
fails on all but one process, and its fix is `exist_ok=True`, not a rank test around a save."""

from __future__ import annotations

import textwrap
from pathlib import Path

SCRIPT = """\
    import os

    import torch
    import torch.distributed as dist


    def main(out):
        dist.init_process_group("gloo")
        if not os.path.exists(out):
            os.makedirs(out)
        model = torch.nn.Linear(4, 4)
        torch.save(model.state_dict(), os.path.join(out, "last.pt"))


    if __name__ == "__main__":
        main("runs/exp")
"""


def test_a_checked_then_made_folder_is_named_by_its_failure_and_fixed_with_exist_ok(check, tmp_path: Path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    result = check(str(tmp_path / "train.py"), "--isolated", "--select", "DDP601", "--format", "json")
    by_line = {f["line"]: f for f in result.findings}
    assert sorted(by_line) == [10, 12]
    folder, save = by_line[10], by_line[12]
    assert "FileExistsError" in folder["message"] and "exist_ok=True" in folder["fix"]["message"]
    assert "the same file at once" in save["message"] and "exist_ok" not in save["fix"]["message"]


HELPER = """\
    import os


    def make_outdir(root, name):
        outdir = os.path.join(root, name)
        if not os.path.exists(outdir):
            os.makedirs(outdir)
        return outdir
"""

CALLER = """\
    import torch.distributed as dist

    from output import make_outdir


    def main(root):
        dist.init_process_group("gloo")
        return make_outdir(root, "run")
"""


def test_a_folder_made_through_a_helper_of_another_file_is_named_by_its_failure(check, tmp_path: Path):
    # The chain's last step is the helper's `os.makedirs`: the message and the fix come from that writer,
    # not from a checkpoint save's ("several processes write the same file").
    (tmp_path / "output.py").write_text(textwrap.dedent(HELPER), encoding="utf-8")
    (tmp_path / "train.py").write_text(textwrap.dedent(CALLER), encoding="utf-8")
    result = check(str(tmp_path / "train.py"), "--select", "DDP601", "--format", "json")
    [chained] = result.findings
    assert chained["line"] == 8
    assert "makes a folder" in chained["message"] and "os.makedirs" in chained["message"]
    assert "FileExistsError" in chained["message"] and "same file" not in chained["message"]
    assert "exist_ok=True" in chained["fix"]["message"]
