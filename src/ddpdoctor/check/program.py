"""Is this program distributed? The markers a launcher-facing program shows, by qualified name.

A program (the files connected by project imports, `ProjectIndex.component`) is taken as distributed when
one of its files shows what a launcher (`torchrun`, `accelerate launch`, `deepspeed`) drives: its own
`init_process_group`, `deepspeed.initialize` / `deepspeed.init_distributed`, an accelerate `Accelerator` or
`PartialState`, a Hugging Face `Trainer` / `TrainingArguments` or a TRL trainer (they set up the process
group from the launcher's environment), torch's `DistributedDataParallel`, or a Lightning `Trainer` with a
DDP, DeepSpeed or FSDP strategy (`SourceFile.trains_with_ddp`). Names are resolved through the file's
imports (`from trl import SFTTrainer`), never matched as substrings of other names.
"""

from __future__ import annotations

from .source import SourceFile

# Where a class or function of these packages is used, a launcher drives the process group.
LAUNCHED_BY = (
    "torch.distributed.init_process_group",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.distributed.fsdp",
    "deepspeed.initialize",
    "deepspeed.init_distributed",
    "accelerate.Accelerator",
    "accelerate.PartialState",
    "accelerate.state.PartialState",
    "accelerate.accelerator.Accelerator",
    "transformers.Trainer",
    "transformers.Seq2SeqTrainer",
    "transformers.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments",
    "transformers.trainer.Trainer",
    "transformers.training_args.TrainingArguments",
)
_WORDS = ("init_process_group", "DistributedDataParallel", "deepspeed", "Accelerator", "PartialState",
          "Trainer", "TrainingArguments", "fsdp", "strategy")


def launched(source: SourceFile) -> bool:
    """The file shows a marker of a distributed program (see the module docstring)."""
    text = source.text
    if not any(word in text for word in _WORDS):
        return False
    if source.trains_with_ddp:
        return True
    for qualname in source.imports.names.values():
        if qualname.startswith(LAUNCHED_BY) or qualname.startswith("deepspeed"):
            return True
        if qualname.startswith("trl.") and qualname.endswith(("Trainer", "Config")):
            return True  # TRL's trainers subclass transformers.Trainer
    return False


def distributed_program(source: SourceFile) -> bool:
    """This file, or a file of its program, shows a marker of a distributed program."""
    if launched(source):
        return True
    project = source.project
    if project is None or source.path not in project.modules:
        return False
    return any(module.launched for module in project.component(source.path))
