"""The backward a LightningModule's training_step ends in: a `return None` under a rank test or a test of
per-rank data skips it on some ranks (lightning_steps.py)."""

from __future__ import annotations

import ast
import textwrap

from ddpdoctor.check.lightning_steps import skipped_steps
from ddpdoctor.check.source import SourceFile

HEAD = "import torch\nimport lightning.pytorch as pl\n\n\nclass M(pl.LightningModule):\n"


def skips(body: str, head: str = HEAD) -> list[tuple[int, bool]]:
    """(line of the `return None`, whether the test reads per-rank data) for a class body."""
    text = head + textwrap.indent(textwrap.dedent(body), "    ")
    source = SourceFile("m.py", text, ast.parse(text))
    return [(s.exit.lineno, bool(s.data)) for s in skipped_steps(source)]


def test_a_none_under_a_finiteness_test_is_hedged_per_rank_data():
    body = ("def training_step(self, batch, i):\n    loss = self.net(batch)\n"
            "    if torch.isnan(loss):\n        return None\n    return loss\n")
    assert skips(body) == [(9, True)]


def test_a_bare_return_under_a_rank_test():
    body = "def training_step(self, batch, i):\n    if self.global_rank == 0:\n        return\n    return 1\n"
    assert skips(body) == [(8, False)]


def test_not_read_without_a_loss_on_any_path_or_under_an_agreed_test():
    none_only = "def training_step(self, batch, i):\n    if self.global_rank == 0:\n        return None\n"
    agreed = "def training_step(self, batch, i):\n    if i > 3:\n        return None\n    return 1\n"
    assert skips(none_only) == [] and skips(agreed) == []


def test_not_read_under_manual_optimisation_or_outside_a_lightning_module():
    body = ("automatic_optimization = False\n\ndef training_step(self, batch, i):\n"
            "    if self.global_rank == 0:\n        return None\n    return 1\n")
    assert skips(body) == []
    plain = "import torch\n\n\nclass M:\n"
    step = "def training_step(self, b, i):\n    if self.global_rank == 0:\n        return\n    return 1\n"
    assert skips(step, plain) == []
