"""The nested "main process first" pairing (check/rank_pairs.py): what it decides, and what it leaves."""

from __future__ import annotations

import textwrap
from pathlib import Path

PAIR = """\
    import os

    import torch.distributed as dist


    def prepare(cache, rank):
        if {first} != 0:
            dist.barrier()
        if os.path.exists(cache):
            if {second} == 0:
                dist.barrier()
        else:
            assert {second} == 0
            open(cache, "w").close()
            dist.barrier()
    """


def lines(check, tmp_path: Path, first: str, second: str) -> list[int]:
    path = tmp_path / "prepare.py"
    path.write_text(textwrap.dedent(PAIR.format(first=first, second=second)), encoding="utf-8")
    result = check(str(path), "--isolated", "--select", "DDP101", "--format", "json")
    return sorted(f["line"] for f in result.findings)


def test_the_same_rank_value_on_both_halves_pairs_up(check, tmp_path):
    assert lines(check, tmp_path, "dist.get_rank()", "dist.get_rank()") == []


def test_a_later_test_of_another_value_is_not_decided(check, tmp_path):
    # `rank` (a parameter) and `dist.get_rank()` may be the same number, but the checker does not know it:
    # the halves are reported as they are
    assert lines(check, tmp_path, "rank", "dist.get_rank()") == [8, 11]
