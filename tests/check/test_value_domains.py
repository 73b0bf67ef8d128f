"""The value domains the rules ask, across files: attributes holding ranks, classes called through
aliases, and whether a program is distributed when its group is made in another module."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ddpdoctor.check.engine import Checker
from ddpdoctor.check.program import program_is_distributed
from ddpdoctor.check.project import ProjectFiles, ProjectIndex
from ddpdoctor.check.rank_sets import RankTest, Role
from ddpdoctor.check.registry import all_rules
from ddpdoctor.check.source import SourceFile


def project(tmp_path: Path, files: dict[str, str]) -> tuple[ProjectIndex, dict[str, SourceFile]]:
    paths = []
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        paths.append(str(path))
    known = ProjectFiles(paths)
    checker = Checker(all_rules())
    summaries = [checker.first_pass(p, known)[1] for p in paths]
    index = ProjectIndex([s for s in summaries if s], known)
    sources = {}
    for name, path in zip(files, paths, strict=True):
        text = Path(path).read_text()
        sources[name] = SourceFile(path, text, ast.parse(text), index)
    return index, sources


DIST_UTILS = """
    import torch.distributed as dist

    def setup(rank, world):
        dist.init_process_group("nccl", rank=rank, world_size=world)
"""
TRAINER = """
    import torch

    class Trainer:
        def fit(self, model):
            torch.save(model.state_dict(), "best.pt")
"""


def test_a_group_made_in_another_module_makes_the_program_distributed(tmp_path):
    main = "from pkg.dist_utils import setup\nfrom pkg.trainer import Trainer\n\nsetup(0, 2)\n"
    _, sources = project(tmp_path, {"pkg/__init__.py": "", "pkg/dist_utils.py": DIST_UTILS,
                                    "pkg/trainer.py": TRAINER, "main.py": main})
    assert program_is_distributed(sources["pkg/trainer.py"])
    assert program_is_distributed(sources["main.py"])


def test_a_trainer_of_a_program_that_makes_no_group_is_not_distributed(tmp_path):
    # The trap: `init_process_group` named in a string or a comment is no group.
    main = "from pkg.trainer import Trainer\n\n# init_process_group is not needed here\nTrainer().fit(m)\n"
    _, sources = project(tmp_path, {"pkg/__init__.py": "", "pkg/trainer.py": TRAINER, "main.py": main})
    assert not program_is_distributed(sources["pkg/trainer.py"])


def test_a_rank_kept_on_self_by_a_base_class_in_another_file(tmp_path):
    base = """
        class Base:
            def __init__(self, worker):
                self.worker = worker
                self.main = None

            def setup(self, rank):
                self.main = rank == 0
    """
    child = """
        from pkg.base import Base

        class Child(Base):
            def step(self):
                return self.worker, self.main
    """
    main = """
        import os
        from pkg.child import Child

        local = int(os.environ["LOCAL_RANK"])
        trainer = Child(local)
        trainer.setup(local)
    """
    index, _ = project(tmp_path, {"pkg/__init__.py": "", "pkg/base.py": base, "pkg/child.py": child,
                                  "main.py": main})
    child_path = str(tmp_path / "pkg/child.py")
    assert index.attributes.of_self(child_path, "Child", "worker") == Role.LOCAL
    main_test = index.attributes.of_self(child_path, "Child", "main")
    assert isinstance(main_test, RankTest) and main_test.then.restricted


def test_an_attribute_also_bound_to_something_else_is_not_a_rank(tmp_path):
    trainer = """
        class Trainer:
            def __init__(self, worker):
                self.worker = worker

            def reset(self, pool):
                self.worker = pool.next_worker()
    """
    main = "import os\nfrom trainer import Trainer\n\nTrainer(int(os.environ['RANK']))\n"
    index, _ = project(tmp_path, {"trainer.py": trainer, "main.py": main})
    assert index.attributes.of_self(str(tmp_path / "trainer.py"), "Trainer", "worker") is None


def test_an_args_attribute_set_to_a_rank_test_in_one_file_and_tested_in_another(tmp_path):
    main = """
        import torch.distributed as dist
        from train import run

        args.is_lead = dist.get_rank() == 0
        run(args)
    """
    train = """
        import torch.distributed as dist

        def run(args):
            if args.is_lead:
                dist.barrier()
    """
    index, _ = project(tmp_path, {"main.py": main, "train.py": train})
    found = index.attributes.of_other("is_lead", str(tmp_path / "train.py"))
    assert isinstance(found, RankTest) and found.then.restricted
    assert index.needs_project(str(tmp_path / "train.py"))


def test_an_object_made_by_an_inherited_classmethod_factory_through_a_package(tmp_path):
    base = """
        class Base:
            @classmethod
            def from_config(cls, cfg):
                return cls(cfg)
    """
    trainer = """
        from pkg.base import Base

        class Trainer(Base):
            def __init__(self, cfg):
                self.cfg = cfg

            def run(self):
                pass
    """
    main = """
        from pkg import Trainer

        def main(cfg):
            trainer = Trainer.from_config(cfg)
            trainer.run()
    """
    index, _ = project(tmp_path, {"pkg/__init__.py": "from .trainer import Trainer\n", "pkg/base.py": base,
                                  "pkg/trainer.py": trainer, "main.py": main})
    site = next(s for s in index.modules[str(tmp_path / "main.py")].functions["main"].calls
                if s.target.name.endswith(".run"))
    found = index.function(site.target)
    assert found is not None and found[0].name == "Trainer.run" and found[0].path.endswith("trainer.py")


def test_a_factory_that_returns_something_else_is_not_followed(tmp_path):
    trainer = """
        class Trainer:
            @classmethod
            def from_config(cls, cfg):
                return cfg.build()

            def run(self):
                pass
    """
    main = "from trainer import Trainer\n\ndef main(cfg):\n    t = Trainer.from_config(cfg)\n    t.run()\n"
    index, _ = project(tmp_path, {"trainer.py": trainer, "main.py": main})
    site = next(s for s in index.modules[str(tmp_path / "main.py")].functions["main"].calls
                if s.target.name.endswith(".run"))
    assert index.function(site.target) is None


def test_a_project_function_called_through_a_partial_or_an_alias(tmp_path):
    helpers = "import torch.distributed as dist\n\ndef sync(group=None):\n    dist.barrier(group)\n"
    main = """
        import functools
        from helpers import sync

        wait_all = functools.partial(sync, group=None)
        again = wait_all
        loop_a = loop_b  # names bound to each other: no call target, and no endless walk
        loop_b = loop_a

        def main():
            again()
            loop_a()
    """
    index, _ = project(tmp_path, {"helpers.py": helpers, "main.py": main})
    targets = [s.target for s in index.modules[str(tmp_path / "main.py")].functions["main"].calls]
    assert [(Path(t.path).name, t.name) for t in targets] == [("helpers.py", "sync")]
    assert index.collective(targets[0]) is not None


def test_a_group_made_through_a_star_imported_module_name(tmp_path):
    header = "import deepspeed\nimport torch\n"
    train = "from header import *\nfrom agent import Agent\n\ndeepspeed.init_distributed()\nAgent().save()\n"
    agent = "from header import *\n\nclass Agent:\n    def save(self):\n        torch.save({}, 'a.pt')\n"
    _, sources = project(tmp_path, {"header.py": header, "train.py": train, "agent.py": agent})
    assert program_is_distributed(sources["agent.py"])
    # The trap: the same program without the call is not distributed.
    _, sources = project(tmp_path / "alone", {"header.py": header, "train.py": train.replace(
        "deepspeed.init_distributed()\n", ""), "agent.py": agent})
    assert not program_is_distributed(sources["agent.py"])


def test_an_args_attribute_is_joined_over_its_own_program_only(tmp_path):
    main = ("import torch.distributed as dist\nfrom train import run\n\n"
            "args.is_lead = dist.get_rank() == 0\nrun(args)\n")
    train = ("import torch.distributed as dist\n\n"
             "def run(args):\n    if args.is_lead:\n        dist.barrier()\n")
    other = "args.is_lead = args.world_size > 1  # another script, not imported: another program\n"
    index, _ = project(tmp_path, {"main.py": main, "train.py": train, "other.py": other})
    assert isinstance(index.attributes.of_other("is_lead", str(tmp_path / "train.py")), RankTest)
    assert index.attributes.of_other("is_lead", str(tmp_path / "other.py")) is None
    # Bound to something else in the program itself: not a rank test.
    index, _ = project(tmp_path / "spoiled", {"main.py": main + "args.is_lead = args.world_size > 1\n",
                                              "train.py": train})
    assert index.attributes.of_other("is_lead", str(tmp_path / "spoiled" / "train.py")) is None
