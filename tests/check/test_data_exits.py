"""Tests over per-rank data: which values of a function differ between the ranks with no rank named, and
which a collective agreed on first (data_exits.py)."""

from __future__ import annotations

import ast
import textwrap

import pytest

from ddpdoctor.check.collectives import CollectiveCalls
from ddpdoctor.check.data_exits import DataTests, agreeing
from ddpdoctor.check.source import SourceFile


def described(body: str) -> str | None:
    """What the last `if` of `f` reads, for a body of `f` (indented by the helper)."""
    text = "import time, math\nimport torch\nimport torch.distributed as dist\n\n\ndef f(model, loader, q):\n"
    text += textwrap.indent(textwrap.dedent(body), "    ")
    source = SourceFile("snippet.py", text, ast.parse(text))
    function = source.tree.body[-1]
    assert isinstance(function, ast.FunctionDef)
    test = [node for node in ast.walk(function) if isinstance(node, ast.If)][-1].test
    labels = CollectiveCalls(source)
    return DataTests(source, lambda call: agreeing(call, labels)).describe(test, function)


@pytest.mark.parametrize(("body", "word"), [
    ("loss = model(1)\nif torch.isnan(loss).any():\n    return\n", "finite"),
    ("loss = model(1)\nif not loss.isfinite():\n    return\n", "finite"),
    ("if math.isinf(model(1)):\n    return\n", "finite"),
    ("start = time.time()\nif time.time() - start > 5:\n    return\n", "clock"),
    ("start = time.perf_counter()\nwaited = time.perf_counter() - start\nif waited > 5:\n    return\n",
     "clock"),
    ("for b in loader:\n    q.append(b)\n    if not q.full():\n        continue\n", "fill level"),
    ("buf = []\nfor x in loader:\n    buf.append(x)\n    if len(buf) < 8:\n        continue\n", "length"),
    ("for x, y in loader:\n    if x is None:\n        continue\n", "batch"),
    ("for i, batch in enumerate(loader):\n    if len(batch) == 0:\n        continue\n", "batch"),
])
def test_per_rank_values(body, word):
    found = described(body)
    assert found is not None and word in found


@pytest.mark.parametrize("body", [
    # agreed by a collective above the test
    "loss = model(1)\ndist.all_reduce(loss)\nif torch.isnan(loss):\n    return\n",
    "flag = torch.tensor(1.0)\ndist.all_reduce(flag)\nstop = flag.item() > 0\n"
    "if stop:\n    return\n",
    # a gradient's norm: DDP reduced the gradients
    "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    "if not torch.isfinite(norm):\n    return\n",
    # items of a loop over something that is no loader, the same on every rank
    "for p in model.parameters():\n    if p.grad is None:\n        continue\n",
    "for k in loader_names:\n    if k is None:\n        continue\n",
    # library calls that read no rank's data
    "if torch.empty(3).sum():\n    return\n",
    "if len(q) < 3:\n    return\n",
    # a bucket filled from the model, not from a loader: the same on every rank
    "if q.is_empty():\n    return\n",
    "for p in model.parameters():\n    q.append(p.grad)\nif len(q) == 0:\n    return\n",
    "if model.step > 3:\n    return\n",
])
def test_agreed_or_not_per_rank(body):
    assert described(body) is None


def test_a_collective_below_the_test_agrees_on_nothing_it_read():
    body = "loss = model(1)\nif torch.isnan(loss):\n    return\ndist.all_reduce(loss)\n"
    assert described(body) is not None


@pytest.mark.parametrize(("test", "per_rank"), [
    ("(run_dir / STATE).exists()", True),  # rank 0's file, by its constant
    ("os.path.isfile(os.path.join(run_dir, 'counter.pt'))", True),  # by its literal name
    ("os.path.isdir(resume_dir)", False),  # a path handed in: the same everywhere
    ("os.path.exists(os.path.join(run_dir, 'other.pt'))", False),  # a file nothing writes from one rank
])
def test_a_file_check_is_per_rank_data_for_a_file_written_on_one_rank(test, per_rank):
    text = textwrap.dedent(f"""
        import os
        import torch

        STATE = "state.pt"

        def save(run_dir, rank, state):
            if rank == 0:
                torch.save(state, run_dir / STATE)
                torch.save(state, os.path.join(run_dir, "counter.pt"))

        def f(run_dir, resume_dir):
            if {test}:
                return
    """)
    source = SourceFile("snippet.py", text, ast.parse(text))
    function = source.tree.body[-1]
    assert isinstance(function, ast.FunctionDef)
    found = DataTests(source, lambda call: False).describe(function.body[0].test, function)  # type: ignore
    assert (found is not None and "file system" in found) is per_rank
