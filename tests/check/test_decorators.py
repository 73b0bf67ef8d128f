"""A project decorator read by its body: the ranks its wrapper runs the decorated function on."""

from __future__ import annotations

import ast
import textwrap

from ddpdoctor.check.decorators import rank_gate
from ddpdoctor.check.rank_sets import Ranks
from ddpdoctor.check.ranks import RankNames


def _gate(code: str):
    tree = ast.parse(textwrap.dedent(code))
    func = tree.body[-1]
    assert isinstance(func, ast.FunctionDef)
    return rank_gate(func, RankNames(tree.body))


def test_a_wrapper_calling_under_a_rank_test_runs_on_those_ranks():
    gate = _gate("""
        import os
        def on_leader(fn):
            def wrapper(*args, **kwargs):
                if int(os.environ["RANK"]) == 0:
                    return fn(*args, **kwargs)
            return wrapper
    """)
    assert gate is not None and gate.kind == Ranks.RANK_ZERO


def test_an_early_return_of_the_other_ranks_gates_too():
    gate = _gate("""
        import torch.distributed as dist
        def on_leader(fn):
            def wrapper(*args, **kwargs):
                if dist.get_rank() != 0:
                    return None
                return fn(*args, **kwargs)
            return wrapper
    """)
    assert gate is not None and gate.kind == Ranks.RANK_ZERO


def test_a_wrapper_testing_its_arguments_or_calling_twice_gates_nothing():
    assert _gate("""
        def on_leader(fn):
            def wrapper(*args, **kwargs):
                if kwargs.get("leader", True):
                    return fn(*args, **kwargs)
            return wrapper
    """) is None
    assert _gate("""
        import torch.distributed as dist
        def on_leader(fn):
            def wrapper(*args, **kwargs):
                if dist.get_rank() == 0:
                    fn(*args, **kwargs)
                return fn(*args, **kwargs)
            return wrapper
    """) is None
