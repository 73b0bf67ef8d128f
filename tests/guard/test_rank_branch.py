"""The rank-conditional branch on a waiting rank's path, read from its frames' source."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.guard.judge.rank_branch import rank_branch
from ddpdoctor.records import Frame

SOURCE = """\
import torch.distributed as dist

def save(step):
    dist.barrier()

rank = dist.get_rank()
for step in range(8):
    if rank == 0 and step % 5 == 0:
        save(step)
    if step % 5 == 0:
        save(step)
"""


def test_the_innermost_rank_test_on_the_path_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    barrier, guarded_call = Frame(str(path), 4, "save", None), Frame(str(path), 9, "<module>", None)
    library = Frame("/site-packages/torch/distributed/distributed_c10d.py", 10, "barrier", "torch")
    branch = rank_branch((library, barrier, guarded_call))
    assert branch is not None and (branch.line, branch.test) == (8, "rank == 0 and step % 5 == 0")
    assert branch.ranks == "global rank 0"


def test_a_test_every_rank_takes_is_no_branch(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    assert rank_branch((Frame(str(path), 4, "save", None), Frame(str(path), 11, "<module>", None))) is None


def test_missing_or_unparsable_source_is_no_evidence(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("if rank == 0:\n    dist.barrier(\n")
    assert (
        rank_branch((Frame(str(broken), 2, "<module>", None), Frame(str(tmp_path / "gone.py"), 3, "f", None)))
        is None
    )
