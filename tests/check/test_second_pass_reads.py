"""How many files the second pass reads again, counted on a small fixed project (a guard against a silent
slowdown: a change that makes `ProjectIndex.needs_project` say yes to every file still finds the same bugs,
so only a count shows it). Counted, never timed: the count does not depend on the machine."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

from ddpdoctor.check import engine
from ddpdoctor.check.registry import all_rules
from ddpdoctor.check.runner import check_files

# Files of a small training project: a script, the helpers it calls across files, and modules with
# nothing distributed in them (most files of a real tree).
PROJECT = {
    "train.py": """\
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        import comm
        from data import make_loader
        from metrics import Agreement
        from model import Net


        def main():
            dist.init_process_group("nccl")
            loader = make_loader()
            net = Net()
            agreement = Agreement()
            for epoch in range(3):
                for batch in loader:
                    net(batch).sum().backward()
                if dist.get_rank() == 0:
                    comm.sync()
                    torch.save(net.state_dict(), "ckpt.pt")
    """,
    "comm.py": """\
        import torch.distributed as dist


        def sync():
            dist.barrier()


        def rank():
            return dist.get_rank()
    """,
    "data.py": """\
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler


        def make_loader():
            dataset = list(range(100))
            return DataLoader(dataset, sampler=DistributedSampler(dataset))
    """,
    "metrics.py": """\
        import torch
        import torchmetrics


        class Agreement(torchmetrics.Metric):
            def __init__(self):
                super().__init__()
                self.add_state("hits", default=torch.tensor(0), dist_reduce_fx="sum")

            def update(self, hits):
                self.hits += hits

            def compute(self):
                return self.hits
    """,
    "model.py": """\
        import torch


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 4)

            def forward(self, x):
                return self.layer(x)
    """,
    **{f"util_{i}.py": f"""\
        import math


        def scale_{i}(values, factor={i}):
            if factor == 0:
                return values
            return [math.sqrt(v) * factor for v in values]
    """ for i in range(8)},
}

# The files whose findings other files change: the script (it calls `comm.sync` under a rank test, draws
# from `make_loader`'s loader and makes a metric of `metrics.py`), the builder of a DistributedSampler
# without `set_epoch`, and `comm.py`, whose barrier the script's rank test reaches (DDP101 is reported at
# both ends). Not `model.py` or `metrics.py`, though they share the script's imports with the metric.
SECOND_PASS = ["comm.py", "data.py", "train.py"]


# the findings themselves are tests/check/test_project.py's; this counts the reads only
def test_the_second_pass_reads_only_the_files_other_files_change(tmp_path: Path, monkeypatch):
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    reads: Counter[str] = Counter()
    read = engine.read_source

    def counted(path: str) -> str:
        reads[Path(path).name] += 1
        return read(path)

    monkeypatch.setattr(engine, "read_source", counted)
    paths = sorted(str(p) for p in tmp_path.glob("*.py"))
    results = check_files(paths, sorted(all_rules()), jobs=1)

    assert len(results) == len(PROJECT)
    again = sorted(name for name, count in reads.items() if count > 1)
    assert again == SECOND_PASS, f"the second pass read {again} again, expected only {SECOND_PASS}"
    assert all(count <= 2 for count in reads.values())
    codes = sorted(f.code for r in results for f in r.findings)
    assert "DDP101" in codes  # the cross-file finding the second pass exists for is still made
