"""Which `__main__` blocks start the distributed program (check/scripts.py): the training script's, a
launcher script's that reaches the module making the group, not a one-process tool's beside them."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpdoctor.check.engine import Checker
from ddpdoctor.check.project import ProjectFiles, ProjectIndex
from ddpdoctor.check.registry import all_rules
from ddpdoctor.check.scripts import block_is_distributed

ENGINE = """\
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def setup():
        dist.init_process_group("nccl")


    def wrap(model):
        return DDP(model)
    """
TOOLS = """\
    from torch.nn.parallel import DistributedDataParallel as DDP


    def smart_wrap(model, ranked):
        return DDP(model) if ranked else model
    """


def index(tmp_path: Path, files: dict[str, str]) -> tuple[ProjectIndex, dict[str, str]]:
    paths = {}
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        paths[name] = str(path)
    known = ProjectFiles(list(paths.values()))
    checker = Checker(all_rules())
    summaries = [checker.first_pass(p, known)[1] for p in paths.values()]
    return ProjectIndex([s for s in summaries if s], known), paths


def distributed(project: ProjectIndex, path: str) -> bool:
    return block_is_distributed(project, path, {})


def test_a_block_that_reaches_the_group_maker_starts_the_program(tmp_path):
    project, paths = index(tmp_path, {"engine.py": ENGINE, "launch.py": """\
        from engine import setup


        def main():
            setup()


        if __name__ == "__main__":
            main()
        """})
    assert distributed(project, paths["launch.py"])


def test_a_tool_reaching_only_a_ddp_wrap_helper_is_one_process(tmp_path):
    project, paths = index(tmp_path, {"engine.py": ENGINE, "tools.py": TOOLS, "export.py": """\
        import torch
        from tools import smart_wrap


        def main():
            torch.save(smart_wrap(torch.nn.Linear(2, 2), False).state_dict(), "model.pt")


        if __name__ == "__main__":
            main()
        """})
    assert not distributed(project, paths["export.py"])


def test_a_script_with_its_own_group_starts_the_program(tmp_path):
    project, paths = index(tmp_path, {"train.py": """\
        import torch.distributed as dist


        if __name__ == "__main__":
            dist.init_process_group("gloo")
        """})
    assert distributed(project, paths["train.py"])
