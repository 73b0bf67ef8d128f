"""Is this program distributed? The markers a launcher-facing program shows, by qualified name.

A file is in a distributed training program when it trains with DDP itself (`SourceFile.trains_with_ddp`:
its own `init_process_group`, `DistributedDataParallel`, a Lightning DDP/FSDP/DeepSpeed strategy), or when
a file of its program (the files connected by project imports, `ProjectIndex.component`) shows what a
launcher (`torchrun`, `accelerate launch`, `deepspeed`) drives for training: `deepspeed.initialize`, a
Hugging Face `Trainer` / `TrainingArguments` or a TRL trainer (they set up the process group from the
launcher's environment), `DistributedDataParallel`, FSDP or a Lightning strategy. Names are resolved
through the file's imports (`from trl import SFTTrainer`), never matched as substrings of other names.
"""

from __future__ import annotations

from .source import SourceFile, dotted

# Where a class or function of these is used, a launcher runs the program's training on several processes.
# An accelerate `Accelerator` or a bare `init_process_group` is not enough for a program's other files:
# both also serve single-process big-model inference (`device_map="auto"` is accelerate's own feature there).
LAUNCHED_BY = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.distributed.fsdp",
    "deepspeed.initialize",
    "transformers.Trainer",
    "transformers.Seq2SeqTrainer",
    "transformers.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments",
    "transformers.trainer.Trainer",
    "transformers.training_args.TrainingArguments",
)
# What makes the default process group: the program runs on several processes, whichever file calls it.
MAKES_GROUP = ("torch.distributed.init_process_group", "deepspeed.init_distributed",
               "deepspeed.comm.init_distributed")
_WORDS = ("DistributedDataParallel", "deepspeed", "Trainer", "TrainingArguments", "fsdp", "strategy")


def launched(source: SourceFile) -> bool:
    """The file shows a marker of distributed training that holds for its whole program (module docstring)."""
    text = source.text
    if not any(word in text for word in _WORDS):
        return False
    if "init_process_group" not in text and source.trains_with_ddp:
        return True  # a Lightning DDP/FSDP/DeepSpeed strategy, DistributedDataParallel
    for qualname in source.imports.names.values():
        if qualname.startswith(LAUNCHED_BY):
            return True
        if qualname.startswith("trl.") and qualname.endswith(("Trainer", "Config")):
            return True  # TRL's trainers subclass transformers.Trainer
    return False


def distributed_program(source: SourceFile) -> bool:
    """This file, or a file of its program, shows a marker of a distributed program."""
    if source.trains_with_ddp or launched(source):
        return True  # the file itself: its own `init_process_group` counts too
    project = source.project
    if project is None or source.path not in project.modules:
        return False
    return any(module.launched for module in project.component(source.path))


def makes_group(source: SourceFile) -> bool:
    """The file makes the default process group itself (`init_process_group`, DeepSpeed's
    `init_distributed`), resolved through its imports."""
    text = source.text
    if "init_process_group" not in text and "init_distributed" not in text:
        return False
    # `from header import *` where header does `import deepspeed`: an unresolved name is taken as written.
    stars = "import *" in text
    for call in source.calls:
        name = source.resolve(call.func) or (dotted(call.func) or "" if stars else "")
        if name.startswith(MAKES_GROUP):
            return True
    return False


def program_is_distributed(source: SourceFile) -> bool:
    """Is the program this file belongs to distributed? A project-wide fact: the file or any module of
    its program (connected by project imports) makes a process group or shows a launcher marker
    (pytext makes its group in `pytext/utils/dist_utils.py`, a DeepSpeed program in its `train.py`, and
    the trainer that saves is another module). The rules that report what every rank does ask this."""
    if distributed_program(source) or makes_group(source):
        return True
    project = source.project
    if project is None or source.path not in project.modules:
        return False
    return any(module.makes_group for module in project.component(source.path))
