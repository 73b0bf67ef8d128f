"""Large generated files: what the checker answers once per file (the module's functions by name, the uses of
every loader name) must still be answered for each function and each loader, whichever comes first, and
the same with many of them as with one. The time these take is benchmarks/check_throughput.py's."""

from __future__ import annotations

from pathlib import Path

DECORATED = """\
import functools
import os

import torch.distributed as dist


def on_leader(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if int(os.environ.get("RANK", "0")) == 0:
            return fn(*args, **kwargs)
        return None

    return wrapper


def traced(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper
"""

LOADERS = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

dist.init_process_group("nccl")
model = DistributedDataParallel(torch.nn.Linear(4, 2).cuda())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def _findings(check, path: Path, code: str) -> list[int]:
    outcome = check(str(path), "--isolated", "--format", "json", "--select", code)
    return sorted(f["line"] for f in outcome.findings if f["code"] == code)


def test_each_function_of_a_large_module_is_read_with_its_own_decorator(check, tmp_path):
    """Four hundred decorated functions; every tenth runs on the leader only, through the module's own
    decorator, and makes a collective there: those and only those are reported."""
    lines = DECORATED.splitlines()
    expected = []
    for i in range(400):
        lines += ["", "", "@on_leader" if i % 10 == 0 else "@traced", f"def step{i}(t):"]
        lines.append("    dist.all_reduce(t)")
        if i % 10 == 0:
            expected.append(len(lines))
    lines += ["", "", "def main(t):", '    dist.init_process_group("gloo")']
    lines += [f"    step{i}(t)" for i in range(400)]
    path = tmp_path / "many_steps.py"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert _findings(check, path, "DDP101") == expected


def test_each_shuffled_loader_of_a_large_file_is_judged_by_its_own_loops(check, tmp_path):
    """Sixty shuffled loaders without a sampler: the even ones only feed evaluation (eval mode, no backward),
    the odd ones are trained on. Only the odd ones are reported, whatever the order they come in."""
    lines = LOADERS.splitlines()
    expected = []
    for i in range(60):
        lines.append(f"loader{i} = DataLoader(list(range(20)), batch_size=8, shuffle=True)")
        if i % 2:
            expected.append(len(lines))
    for i in range(60):
        lines += ["", "", f"def walk{i}():", "    model.eval()" if i % 2 == 0 else "    model.train()"]
        lines.append(f"    for x in loader{i}:")
        lines.append("        model(x)" if i % 2 == 0 else "        model(x).sum().backward()")
        lines += [f"    print(len(loader{i}.dataset))"]
    lines += ["", ""] + [f"walk{i}()" for i in range(60)]
    path = tmp_path / "many_loaders.py"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    found = _findings(check, path, "DDP502")
    # the reported line is the loader's (the `shuffle=True` keyword's line)
    assert found == expected
