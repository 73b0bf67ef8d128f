"""Where a nested function runs (check/nested.py): where its parent calls it, where the project function
it is passed to calls its parameter (through helpers that pass it on), nowhere when that is unknown."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ddpdoctor.check.facts import Target
from ddpdoctor.check.nested import NestedFunctions
from ddpdoctor.check.project import ProjectIndex
from ddpdoctor.check.runner import check_files

HELPERS = """\
import torch.distributed as dist


def on_main(fn, *args):
    if dist.get_rank() == 0:
        fn(*args)


def passes_on(callback, path):
    on_main(callback, path)


def everywhere(fn, path):
    fn(path)


def loops(fn, path):
    loops(fn, path)
"""


def index_of(tmp_path: Path, text: str) -> tuple[ProjectIndex, str]:
    (tmp_path / "helpers.py").write_text(HELPERS, encoding="utf-8")
    main = tmp_path / "main.py"
    main.write_text(textwrap.dedent(text), encoding="utf-8")
    indexes: list[ProjectIndex] = []
    check_files([str(main), str(tmp_path / "helpers.py")], ["DDP601"], jobs=1, indexes=indexes)
    return indexes[0], str(main)


def callers(index: ProjectIndex, path: str, name: str) -> list[tuple[str, bool]]:
    return [(caller.name, site.guarded) for caller, site in index.callers(Target(path, name))]


def test_qualified_names_and_what_a_body_sees():
    tree = ast.parse(textwrap.dedent("""\
        class Runner:
            def run(self):
                def step(i):
                    def inner():
                        step(0)
                    if i:
                        def inner():
                            pass
                step(1)

        def outer():
            class Local:
                def hidden(self):
                    pass
        """))
    nested = NestedFunctions(tree)
    assert sorted(nested.names.values()) == [  # (two `def inner`: one name, as Python gives them)
        "Runner.run.<locals>.step", "Runner.run.<locals>.step.<locals>.inner",
        "Runner.run.<locals>.step.<locals>.inner"]
    step = next(f for f, name in nested.names.items() if name == "Runner.run.<locals>.step")
    run = nested.parent[step]
    inner = min((f for f, name in nested.names.items() if name.endswith("inner")), key=lambda f: f.lineno)
    assert nested.visible("step", inner) is nested.visible("step", run)  # a closure sees its parent's
    assert nested.children[nested.parent[inner]]["inner"].lineno == 7  # the last `def` of a name
    assert nested.visible("hidden", run) is None  # a method of a local class is the class's


def test_a_closure_runs_where_the_helper_calls_it_through_helpers_that_pass_it_on(tmp_path):
    index, main = index_of(tmp_path, """\
        from helpers import everywhere, loops, passes_on


        def save(model, path):
            def write(where):
                model.save(where)

            def log(where):
                print(where)

            def never(where):
                print(where)

            passes_on(write, path)
            everywhere(log, path)
            loops(never, path)
            sorted([path], key=never)
        """)
    assert callers(index, main, "save.<locals>.write") == [("save", True)]  # on_main's rank test
    assert callers(index, main, "save.<locals>.log") == [("save", False)]
    assert callers(index, main, "save.<locals>.never") == []  # a cycle and a library: runs nowhere known


def test_a_closure_called_by_its_parent_is_a_call_with_its_guard(tmp_path):
    index, main = index_of(tmp_path, """\
        import torch.distributed as dist


        def train(steps):
            def step(i):
                return i

            for i in range(steps):
                step(i)
                if dist.get_rank() == 0:
                    step(i)
        """)
    assert callers(index, main, "train.<locals>.step") == [("train", False), ("train", True)]
