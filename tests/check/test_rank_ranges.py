"""Rank predicates judged by the values their parts may take: `rank % d == 0` is one process per node, but
every process when `d` may be 1 (the world size divided by a setting that defaults to the world size)."""

from __future__ import annotations

import ast

import pytest

from ddpdoctor.check.rank_ranges import may_be_one
from ddpdoctor.check.ranks import RankNames, Ranks


def then_kind(expr: str, setup: str = "") -> Ranks:
    names = RankNames(ast.parse(setup).body)
    return names.test(ast.parse(expr, mode="eval").body).then.kind


def test_a_per_node_divisor_is_one_process_per_node():
    assert then_kind("rank % ngpus_per_node == 0") == Ranks.ONE_PER_NODE


def test_a_divisor_that_may_be_one_holds_on_every_rank():
    setup = 'per_node = int(os.environ.get("PROCS_PER_NODE", dist.get_world_size()))\n'
    assert then_kind("dist.get_rank() % (dist.get_world_size() / per_node) == 0", setup) == Ranks.ALL


@pytest.mark.parametrize(("divisor", "setup", "one"), [
    ("world_size / per_node", "per_node = world_size\n", True),
    ("world_size // int(os.getenv('N', world_size))", "", True),
    ("world_size / per_node", "per_node = 8\n", False),
    ("world_size / per_node", "per_node = torch.cuda.device_count()\n", False),
    ("ngpus_per_node", "", False),
])
def test_may_be_one(divisor, setup, one):
    bindings: dict[str, list[ast.expr | None]] = {}
    for stmt in ast.parse(setup).body:
        assert isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
        bindings.setdefault(stmt.targets[0].id, []).append(stmt.value)
    assert may_be_one(ast.parse(divisor, mode="eval").body, bindings) is one


def test_a_binding_read_while_the_names_settle():
    # (`rank % n` in a binding is read while the bindings settle: the ranges must already be there)
    body = ast.parse("rank = dist.get_rank()\ndevice_id = rank % torch.cuda.device_count()\n").body
    names = RankNames(body)
    assert names.role(ast.Name("device_id")) is not None
