"""The rank lattice: which processes take each branch of a rank test, and what follows from it for a
collective (every rank must reach it) and for a checkpoint write (one writer per node)."""

from __future__ import annotations

import ast

import pytest

from ddpdoctor.check.rank_sets import RANK_ZERO
from ddpdoctor.check.ranks import ALL, NONE, SOME, RankNames, Ranks, RankSet, join, meet


def sides(expr: str, setup: str = "") -> tuple[Ranks, Ranks]:
    body = ast.parse(setup).body
    names = RankNames(body)
    result = names.test(ast.parse(expr, mode="eval").body)
    return result.then.kind, result.orelse.kind


@pytest.mark.parametrize(("expr", "then", "orelse"), [
    ("rank == 0", Ranks.RANK_ZERO, Ranks.SOME),
    ("0 == dist.get_rank()", Ranks.RANK_ZERO, Ranks.SOME),
    ("rank != 0", Ranks.SOME, Ranks.RANK_ZERO),
    ("rank == 3", Ranks.ONE_RANK, Ranks.SOME),
    ("trainer.is_global_zero", Ranks.RANK_ZERO, Ranks.SOME),
    ("accelerator.is_main_process", Ranks.RANK_ZERO, Ranks.SOME),
    ("trainer.is_world_process_zero()", Ranks.RANK_ZERO, Ranks.SOME),
    ("accelerator.is_local_main_process", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("local_rank == 0", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("int(os.environ['LOCAL_RANK']) == 0", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("args.rank % ngpus_per_node == 0", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("self.gpu_id == 0", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("args.nr == 0", Ranks.NODE, Ranks.SOME),  # a node rank: every process of node 0
    ("node_rank == 0", Ranks.NODE, Ranks.SOME),
    ("args.rank // ngpus_per_node == 0", Ranks.NODE, Ranks.SOME),
    ("rank % 2 == 0", Ranks.ALL, Ranks.ALL),  # a parity of a number, not a per-node index
    ("local_rank in (-1, 0)", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("local_rank not in (-1, 0)", Ranks.SOME, Ranks.ONE_PER_NODE),
    ("rank in (0, 1)", Ranks.SOME, Ranks.SOME),
    ("local_rank in (0, 1)", Ranks.SOME, Ranks.SOME),  # two processes per node
    ("rank < 0", Ranks.NONE, Ranks.ALL),
    ("rank < 2", Ranks.SOME, Ranks.SOME),
    ("rank == -1", Ranks.NONE, Ranks.ALL),
    ("rank != -1", Ranks.ALL, Ranks.NONE),
    ("rank is None", Ranks.ALL, Ranks.ALL),
    ("rank in group_ranks", Ranks.ALL, Ranks.ALL),  # membership of a group: not a rank condition
    ("dist.get_rank(group=pg) >= 0", Ranks.ALL, Ranks.ALL),  # membership of `pg` (-1 outside it)
    ("rank > -1", Ranks.ALL, Ranks.ALL),
    ("not dist.is_initialized()", Ranks.NONE, Ranks.ALL),
    ("dist.get_world_size() > 1", Ranks.ALL, Ranks.NONE),
    ("world_size == 1", Ranks.NONE, Ranks.ALL),
    ("not distributed or rank == 0", Ranks.RANK_ZERO, Ranks.SOME),
    ("not dist.is_initialized() or dist.get_rank() == 0", Ranks.RANK_ZERO, Ranks.SOME),
    ("not args.multiprocessing_distributed or (args.multiprocessing_distributed and "
     "args.rank % ngpus_per_node == 0)", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("rank == 0 and verbose", Ranks.RANK_ZERO, Ranks.ALL),
    ("rank == 0 or verbose", Ranks.ALL, Ranks.SOME),
    ("args.nr == 0 and gpu == 0", Ranks.ONE_RANK, Ranks.SOME),  # local rank 0 of node 0
    ("rank == 0 or local_rank == 0", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("loss > 0.5", Ranks.ALL, Ranks.ALL),
])
def test_rank_tests(expr, then, orelse):
    assert sides(expr) == (then, orelse)


def test_local_variables_carry_what_they_count():
    setup = "r = dist.get_rank()\nlr = int(os.environ['LOCAL_RANK'])\nmain = r == 0\nnode_main = lr == 0\n"
    assert sides("r == 0", setup) == (Ranks.RANK_ZERO, Ranks.SOME)
    assert sides("lr == 0", setup) == (Ranks.ONE_PER_NODE, Ranks.SOME)
    assert sides("main", setup) == (Ranks.RANK_ZERO, Ranks.SOME)
    assert sides("not node_main", setup) == (Ranks.SOME, Ranks.ONE_PER_NODE)
    # `rank = nr * gpus + gpu` is a global rank, whatever its parts count.
    assert sides("rank == 0", "rank = args.nr * args.gpus + gpu\n") == (Ranks.RANK_ZERO, Ranks.SOME)


def test_an_object_made_on_some_ranks_only_makes_its_presence_a_rank_test():
    setup = "stopper = Stopper(5) if dist.get_rank() == 0 else None\n"
    assert sides("stopper is not None", setup) == (Ranks.RANK_ZERO, Ranks.SOME)
    assert sides("stopper is None", setup) == (Ranks.SOME, Ranks.RANK_ZERO)
    assert sides("stopper", setup) == (Ranks.RANK_ZERO, Ranks.SOME)
    assert sides("s is not None", "s = None if rank == 0 else Saver()\n") == (Ranks.SOME, Ranks.RANK_ZERO)
    # an object on every rank, or a choice between two objects: no rank test
    assert sides("s is not None", "s = A() if rank == 0 else B()\n") == (Ranks.ALL, Ranks.ALL)
    assert sides("s is not None", "s = Sampler() if world_size > 1 else None\n") == (Ranks.ALL, Ranks.ALL)
    # a rank read through its fallback (`gpu_rank = 0` outside a distributed run) settles what reads it
    setup = ("if device_id >= 0:\n    gpu_rank = opt.gpu_ranks[device_id]\nelse:\n    gpu_rank = 0\n"
             "stopper = Stopper() if opt.patience > 0 and gpu_rank == 0 else None\n")
    assert sides("stopper is not None", setup) == (Ranks.RANK_ZERO, Ranks.ALL)  # no patience: none has it
    assert sides("ranks[0] == 0", "") == (Ranks.ALL, Ranks.ALL)  # a literal index: one rank of a group
    # bound in the rank branch only, nothing elsewhere
    setup = "stopper = None\nif rank == 0:\n    stopper = Stopper()\n"
    assert sides("stopper is not None", setup) == (Ranks.RANK_ZERO, Ranks.SOME)
    assert sides("stopper", "stopper = None\nif rank != 0:\n    pass\nelse:\n    stopper = S()\n") == (
        Ranks.RANK_ZERO, Ranks.SOME)
    # made on every rank after all: no rank test
    setup = "stopper = None\nif rank == 0:\n    stopper = Stopper()\nstopper = Stopper()\n"
    assert sides("stopper is not None", setup) == (Ranks.ALL, Ranks.ALL)


def test_a_rank_name_bound_to_something_else_is_no_rank():
    assert sides("rank == 0", "for rank in range(world_size):\n    pass\n") == (Ranks.ALL, Ranks.ALL)
    assert sides("gpu == 0", "gpu = pick()\ngpu = None\n") == (Ranks.ALL, Ranks.ALL)


def test_meet_never_adds_writers_and_join_never_loses_ranks():
    kinds = [
        NONE,
        RANK_ZERO,
        RankSet(Ranks.ONE_RANK),
        RankSet(Ranks.ONE_PER_NODE),
        RankSet(Ranks.NODE),
        SOME,
        ALL,
    ]
    for a in kinds:
        for b in kinds:
            both, either = meet(a, b), join(a, b)
            assert meet(b, a).kind == both.kind and join(b, a).kind == either.kind
            if a.one_writer_per_node or b.one_writer_per_node:
                assert both.one_writer_per_node, (a, b)
            if not (a.one_writer_per_node and b.one_writer_per_node):
                assert not either.one_writer_per_node or {a.kind, b.kind} & {Ranks.NONE}, (a, b)
            if Ranks.ALL in (a.kind, b.kind):
                assert either.kind == Ranks.ALL
            if Ranks.NONE in (a.kind, b.kind):
                assert both.kind == Ranks.NONE


def test_writers_and_restriction():
    assert RANK_ZERO.one_writer_per_node and RANK_ZERO.restricted
    assert RankSet(Ranks.ONE_PER_NODE).one_writer_per_node
    assert not RankSet(Ranks.NODE).one_writer_per_node and RankSet(Ranks.NODE).restricted
    assert not ALL.restricted and not ALL.one_writer_per_node
    assert not NONE.restricted and NONE.one_writer_per_node


def test_known_members_decide_group_coverage():
    assert RankSet(Ranks.SOME, frozenset({0, 1})).covers(frozenset({0, 1}))
    assert not RANK_ZERO.covers(frozenset({0, 1}))
    assert not SOME.covers(frozenset({0}))
    then = ast.parse("rank in (0, 1)", mode="eval").body
    assert RankNames([]).test(then).then.members == frozenset({0, 1})
    below = ast.parse("rank < 2", mode="eval").body
    assert RankNames([]).test(below).then.members == frozenset({0, 1})


@pytest.mark.parametrize(("expr", "then", "orelse"), [
    ("os.environ.get('LOCAL_RANK', '0') == '0'", Ranks.ONE_PER_NODE, Ranks.SOME),
    ("os.environ['RANK'] == '0'", Ranks.RANK_ZERO, Ranks.SOME),
    ("not rank", Ranks.RANK_ZERO, Ranks.SOME),
    ("args.local_rank", Ranks.SOME, Ranks.ONE_PER_NODE),
    ("use_gpu", Ranks.ALL, Ranks.ALL),
    ("training_args.should_save", Ranks.ONE_PER_NODE, Ranks.SOME),
])
def test_truthiness_and_string_ranks(expr, then, orelse):
    assert sides(expr) == (then, orelse)


def guards_of(code: str) -> dict[str, tuple[Ranks | None, bool]]:
    """For each call `mark_X()` in `code`: the kind of ranks its guard lets through, and whether the guard
    is an early exit."""
    import textwrap

    from ddpdoctor.check.guards import RankFlow
    from ddpdoctor.check.source import SourceFile

    text = textwrap.dedent(code)
    flow = RankFlow(
        SourceFile("snippet.py", text, ast.parse(text)), lambda branch, cls: False, skip_unranked=False
    )
    return {
        call.call.func.id: (
            call.guard.ranks.kind if call.guard else None,
            bool(call.guard and call.guard.early_exit),
        )
        for call in flow.calls
        if isinstance(call.call.func, ast.Name) and call.call.func.id.startswith("mark_")
    }


def test_what_runs_after_a_rank_branch_that_leaves():
    found = guards_of("""
        def train(loader, rank):
            for step in loader:
                mark_before()
                if rank == 0:
                    if step > 9:
                        break
                mark_after()
            mark_past_loop()

        def save(rank):
            if rank != 0:
                return
            mark_rank_zero_only()

        def check(rank, path):
            if rank == 0 and not exists(path):
                raise FileNotFoundError(path)
            mark_everyone()

        def nested(rank, cond):
            if cond:
                if rank != 0:
                    return
            mark_maybe_all()
    """)
    assert found["mark_after"] == (Ranks.SOME, True)
    assert found["mark_before"] == (Ranks.SOME, True)  # rank 0 misses it in every later iteration
    assert found["mark_past_loop"] == (None, False)  # a break leaves the loop only
    assert found["mark_rank_zero_only"] == (Ranks.RANK_ZERO, True)
    assert found["mark_everyone"] == (None, False)  # a raise is a crash, not a way to skip ahead
    assert found["mark_maybe_all"] == (Ranks.SOME, True)  # without `cond`, every rank goes on


def test_nested_rank_tests_narrow_the_guard():
    found = guards_of("""
        def main(args, gpu):
            if args.nr == 0:
                mark_node()
                if gpu == 0:
                    mark_one()
    """)
    assert found["mark_node"] == (Ranks.NODE, False)
    assert found["mark_one"] == (Ranks.ONE_RANK, False)


def test_every_rank_spelling_passes_the_per_function_prefilter():
    """A function is only walked if its text holds one of RANK_WORDS: each name the lattice knows must."""
    from ddpdoctor.check import rank_sources
    from ddpdoctor.check.guards import RANK_WORDS, RANK_ZERO_DECORATORS

    spellings = (rank_sources.RANK_NAMES | rank_sources.NODE_ATTRS | rank_sources.RANK_METHODS
                 | rank_sources.RANK_FLAGS | set(rank_sources.RANK_ENV) | set(RANK_ZERO_DECORATORS))
    missing = {
        name for name in spellings if not any(word in name or word in f".{name}" for word in RANK_WORDS)
    }
    assert not missing
