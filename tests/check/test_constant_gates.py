"""What a constant argument turns off (constant_gates.py) and which flags a project never raises (flags.py):
the two facts the call graph and the rank walk take from the first pass."""

from __future__ import annotations

import ast
import textwrap

from ddpdoctor.check.argument_shapes import NotNone, Prefixless, Shape, matches
from ddpdoctor.check.constant_gates import gates, given_constants, truth
from ddpdoctor.check.flags import flag_bindings, never_raised

MAIN_FIRST = textwrap.dedent("""
    def main_first(local_rank, timeout=30):
        if local_rank not in (-1, 0):
            barrier()
        yield
        if local_rank == 0:
            barrier()
        log(timeout)
""")


def _function(text: str) -> ast.FunctionDef:
    node = ast.parse(text).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def _barrier(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Name) and call.func.id == "barrier"


def test_minus_one_turns_off_both_barriers_and_zero_only_the_first():
    func = _function(MAIN_FIRST)
    found = {(g.param, g.value): g for g in gates(func, ("local_rank", "timeout"), _barrier)}
    assert found[(0, -1)].own_quiet
    assert not found[(0, 0)].own_quiet  # rank 0 waits at the second barrier
    assert found[(0, 0)].unreached == {4}  # the first barrier's line does not run for rank 0


def test_a_parameter_the_function_rebinds_is_not_read():
    func = _function("def f(rank):\n    rank = rank or 0\n    if rank == 0:\n        barrier()\n")
    assert gates(func, ("rank",), _barrier) == ()


def test_a_test_over_anything_else_is_unknown_both_ways():
    test = ast.parse("rank == 0 and ready()", mode="eval").body
    assert truth(test, {"rank": 0}) is None
    assert truth(test, {"rank": 1}) is False
    assert truth(ast.parse("rank in (-1, 0) or ready()", mode="eval").body, {"rank": -1}) is True


def test_a_call_says_its_literals_and_what_it_leaves_to_defaults():
    call = ast.parse("make(path, 16, rank=-1, name=x)", mode="eval").body
    assert isinstance(call, ast.Call)
    assert given_constants(call) == (((1, 16), ("rank", -1)), (2, ("rank", "name")))
    open_call = ast.parse("make(*args, rank=0)", mode="eval").body
    assert isinstance(open_call, ast.Call)
    assert given_constants(open_call)[1] is None  # which defaults apply is unknown


def _flags(text: str) -> frozenset[str]:
    tree = ast.parse(textwrap.dedent(text))
    assigns = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    return never_raised([flag_bindings(tree, assigns, calls)])


def test_a_flag_declared_false_and_never_set_is_never_raised():
    assert _flags("""
        class Hooks:
            def __init__(self):
                self.stop = False
    """) == {"stop"}


def test_a_flag_set_anywhere_or_declared_by_a_library_subclass_is_not():
    assert _flags("""
        class Hooks:
            def __init__(self):
                self.stop = False
        def on_nan(hooks):
            hooks.stop = True
    """) == set()
    assert _flags("""
        class Stopper(Callback):
            def __init__(self):
                self.stop = False
    """) == set()
    assert _flags("""
        class Hooks:
            def __init__(self, **options):
                self.stop = False
                for key, value in options.items():
                    setattr(self, key, value)
    """) == set()
    assert _flags("""
        class Hooks:
            def __init__(self):
                self.stop = False
        setattr(hooks, "stop", True)
    """) == set()


def test_a_store_known_given_turns_off_the_no_store_branch_until_the_parameter_is_bound_again():
    func = _function(textwrap.dedent("""
        def fetch(path, store=None):
            if store is None:
                barrier()
            store = pick(store)
            if store is None:
                barrier()
    """))
    found = {(g.param, g.value): g for g in gates(func, ("path", "store"), _barrier)}
    # the first test is decided for a store that is given; the second reads the store bound in between
    assert found[(1, Shape.NOT_NONE)].unreached == {4}


def test_a_literal_path_decides_a_prefix_test_and_a_name_walking_annotated_stores_is_not_none():
    func = _function(textwrap.dedent("""
        def store_for(uri):
            if uri.startswith(("s3://", "gs://")):
                barrier()
    """))
    found = {(g.param, g.value): g for g in gates(func, ("uri",), _barrier)}
    assert not found  # one prefix ruled out leaves the other: nothing is turned off
    assert truth(ast.parse("uri.startswith(('s3://', 'gs://'))").body[0].value, {"uri": "/tmp/x"}) is False
    assert matches("/tmp/x", Prefixless("s3://")) and not matches("s3://b/x", Prefixless("s3://"))
    caller = _function(textwrap.dedent("""
        def fetch_all(path, stores: Sequence[Store], maybe: Optional[Store], later: list[Store] = None):
            for store in stores:
                get(path, store, maybe, later)
    """))
    call = caller.body[0].body[0].value  # type: ignore[attr-defined]
    constants, _ = given_constants(call, NotNone(caller))
    assert constants == ((1, Shape.NOT_NONE),)
