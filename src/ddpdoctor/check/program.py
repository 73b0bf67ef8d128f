"""Is this program distributed? The markers a launcher-facing program shows, by qualified name.

A file is in a distributed training program when it trains with DDP itself (`SourceFile.trains_with_ddp`:
its own `init_process_group`, `DistributedDataParallel`, a Lightning DDP/FSDP/DeepSpeed strategy), or when
a file of its program (the files connected by project imports, `ProjectIndex.component`) shows what a
launcher (`torchrun`, `accelerate launch`, `deepspeed`) drives for training: `deepspeed.initialize`, a
Hugging Face `Trainer` / `TrainingArguments` or a TRL trainer (they set up the process group from the
launcher's environment), `DistributedDataParallel`, FSDP or a Lightning strategy; and a program a file
of which makes the default group (`init_process_group`, DeepSpeed's `init_distributed`, Colossal-AI's
`launch*`: `MAKES_GROUP`) is distributed. Names are resolved through the file's imports (`from trl
import SFTTrainer`), never matched as substrings of other names.
"""

from __future__ import annotations

import ast
import os

from .source import SourceFile, dotted, is_lightning

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
_CALLED_MARKERS = tuple(marker for marker in LAUNCHED_BY if marker.startswith("deepspeed."))
# What makes the default process group: the program runs on several processes, whichever file calls it.
# Colossal-AI's `launch*` call `init_process_group` (colossalai/initialize.py), as DeepSpeed's
# `init_distributed` does (deepspeed/comm/comm.py): the backends they pick are `backends.FRAMEWORK_INITS`.
MAKES_GROUP = ("torch.distributed.init_process_group", "deepspeed.init_distributed",
               "deepspeed.comm.init_distributed", *(
                   f"colossalai.{module}{name}" for module in ("", "initialize.") for name in (
                       "launch(", "launch_from_torch(", "launch_from_slurm(", "launch_from_openmpi(")))
_WORDS = ("DistributedDataParallel", "deepspeed", "Trainer", "TrainingArguments", "fsdp", "strategy")
# What a script that starts the processes itself says (a group of its own, a DDP wrap, a Fabric launcher):
# its calls of another file's helpers may reach a save there.
LAUNCH_WORDS = ("init_process_group", "DistributedDataParallel", "Fabric")


# Another framework's multi-process runtime: a JAX/Flax or TensorFlow program runs on several hosts by its
# own machinery (`jax.distributed.initialize()`, `jax.process_index()`, `pmap`, `tf.distribute`), never
# torch's; it may still import `transformers.TrainingArguments` for its flags (Hugging Face's Flax examples
# subclass it) or torch's `DataLoader` for its input pipeline.
_OTHER_MULTIPROCESS = (
    "jax.distributed", "jax.process_index", "jax.process_count", "jax.pmap", "jax.device_count",
    "jax.local_device_count", "jax.local_devices", "jax.experimental.multihost_utils",
    "jax.experimental.pjit", "jax.sharding", "flax.jax_utils", "flax.training.common_utils.shard",
    "tensorflow.distribute", "keras.distribution",
)
# What makes a file torch's distributed program whatever else it imports.
_TORCH_DISTRIBUTED = (
    "torch.distributed", "torch.nn.parallel", "torch.multiprocessing", "torch.utils.data.distributed",
    "deepspeed", "accelerate", "lightning", "pytorch_lightning", "horovod.torch", "transformers.Trainer",
    "transformers.Seq2SeqTrainer", "transformers.trainer.", "trl.",
)


def other_framework_program(source: SourceFile) -> bool:
    """The file's multi-process machinery is another framework's (JAX/Flax, TensorFlow: `_OTHER_MULTIPROCESS`,
    resolved through its imports) and it shows no marker of torch's (`torch.distributed`, DDP, a group of
    its own, DeepSpeed, accelerate, Lightning, a Hugging Face `Trainer`): its processes are that framework's
    hosts, and neither it nor its program is a torch distributed program."""
    text = source.text
    if not any(word in text for word in ("jax", "flax", "tensorflow", "keras")):
        return False
    names = source.imports.names.values()
    if source.trains_with_ddp or any(q.startswith(_TORCH_DISTRIBUTED) for q in names) or makes_group(source):
        return False
    return any(isinstance(node, (ast.Attribute, ast.Name)) and (
        source.resolve(node) or "").startswith(_OTHER_MULTIPROCESS) for node in ast.walk(source.tree))


def launched(source: SourceFile) -> bool:
    """The file shows a marker of distributed training that holds for its whole program (module docstring)."""
    if other_framework_program(source):
        return False
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
    # `import deepspeed` then `deepspeed.initialize(...)`: DeepSpeed's marker is a call of its package's
    # function, which the imports alone never show. (A class reached as an attribute, `transformers.Trainer`,
    # is not read this way: a script that names it so is not taken as launched by torchrun.)
    return "deepspeed" in text and any(
        (source.resolve(call.func) or "").startswith(_CALLED_MARKERS) for call in source.calls)


def distributed_program(source: SourceFile) -> bool:
    """This file, or a file of its program, shows a marker of a distributed program."""
    if source.trains_with_ddp or launched(source):
        return True  # the file itself: its own `init_process_group` counts too
    project = source.project
    if project is None or source.path not in project.modules or other_framework_program(source):
        return False
    return any(module.launched for module in project.component(source.path))


def makes_group(source: SourceFile) -> bool:
    """The file makes the default process group itself (`init_process_group`, DeepSpeed's
    `init_distributed`), resolved through its imports."""
    text = source.text
    if "init_process_group" not in text and "init_distributed" not in text and "colossalai" not in text:
        return False
    # `from header import *` where header does `import deepspeed`: an unresolved name is taken as written.
    stars = "import *" in text
    for call in source.calls:
        name = source.resolve(call.func) or (dotted(call.func) or "" if stars else "")
        if (name + "(").startswith(MAKES_GROUP):  # `launch(` is no prefix of `launcher.x`
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
    if project is None or source.path not in project.modules or other_framework_program(source):
        return False
    return any(module.makes_group for module in project.component(source.path))


# What of accelerate's API only a program run on several processes uses: a big-model inference script
# (`device_map="auto"`, one process) calls none of these, a training script under `accelerate launch` does.
_ACCELERATE_MULTIPROCESS = frozenset({
    "backward", "wait_for_everyone", "is_main_process", "is_local_main_process", "gather",
    "gather_for_metrics", "reduce", "main_process_first", "on_main_process", "num_processes", "process_index",
})


def accelerate_trains(source: SourceFile) -> bool:
    """The file imports accelerate and uses its multi-process API (`accelerator.backward(loss)`,
    `wait_for_everyone()`, `is_main_process`...): `accelerate launch` runs it once per process, and what it
    does outside a main-process test (a bare `torch.save`) every process does. `accelerator.save` and
    `save_state` write once; they are not `torch.save`."""
    if "accelerate" not in source.text or not any(
            qualname.startswith("accelerate") for qualname in source.imports.names.values()):
        return False
    return any(isinstance(node, ast.Attribute) and node.attr in _ACCELERATE_MULTIPROCESS
               for node in ast.walk(source.tree))


# The Lightning `Trainer` arguments that choose how many processes run the script.
_PROCESS_COUNT = ("strategy", "accelerator", "distributed_backend", "devices", "gpus", "num_nodes")
# Strategies whose launcher starts the script again in every process (Lightning's subprocess launcher).
# `ddp_spawn`/`ddp_fork` run `fit` in children: the script's own code after it runs once, in the parent.
_RELAUNCHED = ("ddp", "fsdp", "deepspeed", "horovod")
_IN_CHILDREN = ("ddp_spawn", "ddp_fork", "ddp_notebook", "dp")


def accelerate_training(source: SourceFile) -> bool:
    """The file trains under accelerate: it uses accelerate's multi-process API (`accelerate_trains`) and
    prepares a model with its optimizer (`accelerator.prepare(model, optimizer, ...)`). `accelerate launch`
    on several GPUs runs it under DDP (accelerate's `prepare_model` wraps the model then)."""
    return "prepare" in source.text and accelerate_trains(source) and any(
        isinstance(call.func, ast.Attribute) and call.func.attr == "prepare" and len(call.args) >= 2
        for call in source.calls)


def lightning_runs_every_rank(source: SourceFile) -> bool:
    """The file builds a Lightning `Trainer` that may run the whole script once per process: a relaunching
    strategy (`strategy="ddp"`), several devices or nodes (`devices=4`, `gpus=-1`, `num_nodes=2`: since
    Lightning 1.5 these default to `ddp`), or a process count the command line picks
    (`Trainer.from_argparse_args(args)`, `Trainer(**vars(args))`, `devices=args.devices`). Then the
    script's code outside Lightning's hooks (a `torch.save` after `trainer.fit`) runs on every rank. Lightning
    Fabric alike: `Fabric(devices=2, strategy="ddp")` starts the script again in each process, and
    `fabric.launch(main)` calls `main` in every one of them."""
    if "Trainer" not in source.text and "Fabric" not in source.text:
        return False
    for call in source.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in ("from_argparse_args", "from_argparse"):
            if is_lightning(source.resolve(func.value), "Trainer"):
                return True
            continue
        if not any(is_lightning(source.resolve(func), name) for name in ("Trainer", "Fabric")):
            continue
        if any(kw.arg is None for kw in call.keywords):
            return True  # `Trainer(**config)`: the command line or a config file picks the process count
        if any(kw.arg in _PROCESS_COUNT and _several_processes(kw.arg, kw.value) for kw in call.keywords):
            return True
    return False


def _several_processes(argument: str, value: ast.expr) -> bool:
    """One `Trainer` argument may start several processes that each run the script (a value that is not a
    literal may: the command line picks it)."""
    if not isinstance(value, (ast.Constant, ast.List, ast.Tuple, ast.UnaryOp)):
        return True
    if isinstance(value, (ast.List, ast.Tuple)):
        return len(value.elts) > 1
    if isinstance(value, ast.UnaryOp):
        return isinstance(value.op, ast.USub)  # `devices=-1`: every device
    constant = value.value
    if argument in ("strategy", "accelerator", "distributed_backend"):
        return isinstance(constant, str) and constant.startswith(_RELAUNCHED) and not (
            constant.startswith(_IN_CHILDREN))
    if isinstance(constant, str):  # `devices="0,1"` lists device indices, `devices="2"` counts them
        parts = [part for part in constant.split(",") if part.strip()]
        return len(parts) > 1 or constant.strip().lstrip("-").isdigit() and int(constant) not in (0, 1)
    return isinstance(constant, int) and not isinstance(constant, bool) and constant > 1


# What a test module's code names when its tests start several processes (a distributed harness, a launcher
# in a subprocess, a group of its own); without any of them pytest runs each test in its one process.
_SEVERAL_PROCESSES = ("init_process_group", "init_distributed", "spawn", "Distributed", "MultiProcess",
                      "world_size", "multi_gpu", "multi_accelerator", "num_processes", "nprocs")
_LAUNCH_COMMANDS = ("torchrun", "launch", "deepspeed")  # in a command string the test runs


def one_process_test(source: SourceFile, function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> bool:
    """`function` is a test that pytest runs in its own one process: a `test_*` function of a `test_*.py`
    (or `*_test.py`) module whose code names nothing that starts more (`_SEVERAL_PROCESSES`, a launch
    command). Its program's markers (the trainer the test imports) say how the library is launched for
    training, not how the test runs."""
    name = os.path.basename(source.path)
    if function is None or not function.name.startswith("test") or not (
            name.startswith("test_") or name.endswith("_test.py")):
        return False
    docstrings = {id(node.value) for node in ast.walk(source.tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if any(word in node.value for word in _LAUNCH_COMMANDS):
                return False
            continue
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else (
            node.name if isinstance(node, (ast.alias, ast.ClassDef)) else None)
        if word is not None and any(part in word for part in _SEVERAL_PROCESSES):
            return False
    return True
