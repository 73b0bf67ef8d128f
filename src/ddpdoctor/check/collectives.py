"""What counts as a collective: a call every rank of the group must make, in the same order.

`CollectiveCalls(source).label(call)` names the collective a call issues (`dist.all_reduce`,
`self.log(sync_dist=True)`, `accelerator.gather`, ...) or returns None. Point-to-point calls (`send`,
`recv`, ...) are deliberately not collectives here: a rank test is how p2p code says who sends and who
receives, so flagging them would be wrong almost every time.

Framework calls count where their library's source makes them collective (versions read: Lightning 2.6.6,
accelerate 1.15.0, torchmetrics 1.9.0 as installed; DeepSpeed 0.16.5 and transformers main, read from
their repositories):

- Lightning `Trainer.save_checkpoint` ends in `strategy.barrier("Trainer.save_checkpoint")`; Fabric's
  `save` and `load` "must be called on all processes!" and end in `self.barrier()`.
- accelerate `Accelerator.gather`, `gather_for_metrics`, `reduce`, `pad_across_processes` and
  `wait_for_everyone` always are; `save_state` and `save_model` / `get_state_dict` only under DeepSpeed
  (ZeRO-3 consolidation, `engine.save_checkpoint`) or FSDP (full state dict), or `save_state` with
  `automatic_checkpoint_naming` (a `wait_for_everyone`): counted only when the file shows DeepSpeed, FSDP or
  that option. Under plain DDP they write from the main process themselves and never wait.
- DeepSpeed `DeepSpeedEngine.save_checkpoint` ("all processes must call this method ... it will hang
  waiting to synchronize", runtime/engine.py) on an engine from `deepspeed.initialize`, and
  `deepspeed.zero.GatheredParameters` (all-gathers the parameters on enter and broadcasts them on exit
  from `modifier_rank`, runtime/zero/partition_parameters.py).
- transformers `Trainer.evaluate` / `predict` (the evaluation loop gathers through
  `accelerator.gather_for_metrics`), and `Trainer.save_model` under DeepSpeed or FSDP (it consolidates the
  state dict through `accelerator.get_state_dict`); plain DDP `save_model` saves where `args.should_save`.
  `Trainer.push_to_hub` everywhere ("Needs to be executed on all processes": it calls `save_model` first,
  then returns unless `is_world_process_zero()`): a collective under DeepSpeed or FSDP, which the launch may
  pick without a word in the file, so where the file does not show it the finding says so.
- torchmetrics `Metric.compute()` syncs the metric states with `gather_all_tensors` when a process group
  is initialised (`Metric._wrap_compute` -> `sync_context`), unless the metric was built with
  `sync_on_compute=False`.
- torch `DTensor.full_tensor()` "will perform necessary collectives to gather the local tensors from
  other ranks" (torch/distributed/tensor/_api.py: it is `redistribute(placements=[Replicate()] *
  mesh.ndim).to_local()`); `redistribute` to a `Replicate()` placement all-gathers a `Shard` and
  all-reduces a `Partial` (torch/distributed/tensor/_redistribute.py, `placement_types.py`
  `_to_replicate_tensor`). DTensor is torch's one class with a `full_tensor` method, so the method is read
  by its name (hedge: a project class with a method of that name would be misread); `redistribute` counts
  only with a `Replicate()` in its arguments (to `Shard` from `Replicate` is a local split).
- torch's own calls that are collectives without the name of one (torch 2.13, read from its source):
  `torch.distributed.checkpoint.save`/`load`/`async_save`/`save_state_dict`/`load_state_dict` ("Save a
  distributed model in SPMD style", coordinated with collectives unless `use_collectives=False` or
  `no_dist=True`: checkpoint/state_dict_saver.py, state_dict_loader.py); `init_device_mesh` (`new_group` or
  `split_group` for each mesh dimension, calls every process of the default group makes: device_mesh.py);
  the `DistributedDataParallel` constructor (`_verify_param_shape_across_processes`, then
  `_sync_module_states`, a broadcast from rank 0: nn/parallel/distributed.py); FSDP's
  `summon_full_params` (an all-gather of the flat parameters) and its optimizer-state functions
  `full_optim_state_dict`, `optim_state_dict`, `scatter_full_optim_state_dict` ("This needs to be called on
  all ranks since it uses collective communications": fsdp/fully_sharded_data_parallel.py).
- DeepSpeed's `deepspeed.comm` mirrors torch.distributed's functions and forwards them to the backend's
  (deepspeed/comm/comm.py): `deepspeed.comm.all_reduce` is the collective `torch.distributed.all_reduce` is;
  ignite's `ignite.distributed` helpers `all_reduce`, `all_gather`, `broadcast` and `barrier` call the
  native group's collectives (ignite/distributed/utils.py, comp_models/native.py).
- transformers `Trainer.train` prepares the model with accelerate (DDP, FSDP or DeepSpeed in a
  multi-process run) and steps it: the gradient all-reduce of every step is a collective of every process.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cached_property

from ..collectives import TORCH_DISTRIBUTED
from .metric_objects import MetricObjects
from .source import SourceFile, dotted, is_true, keyword, statements

# Every torch.distributed op that all ranks of a group must call in the same order: the collectives and
# the group-forming calls of the shared table. Point-to-point ops are left out (see the module docstring).
TORCH_COLLECTIVES = frozenset(op.name for op in TORCH_DISTRIBUTED if not op.p2p)
# Position of the tensor argument(s) of each collective that moves tensor data, one tensor each (a list of
# tensors is not a tensor expression): where a CPU tensor meets an NCCL-only group.
TENSOR_ARGS: dict[str, tuple[int, ...]] = {
    op.name: positions
    for op in TORCH_DISTRIBUTED
    if not op.p2p and (positions := tuple(sorted(t.position for t in op.tensors if not t.is_list)))
}
STRATEGY_COLLECTIVES = frozenset({"barrier", "broadcast", "reduce", "all_gather", "reduce_boolean_decision"})
# `fabric.save` and `fabric.load` "must be called on all processes!" (both end in `self.barrier()`).
FABRIC_COLLECTIVES = frozenset({"barrier", "broadcast", "all_gather", "all_reduce", "save", "load"})
ACCELERATE_COLLECTIVES = frozenset({"gather", "reduce", "wait_for_everyone", "gather_for_metrics",
                                    "pad_across_processes", "broadcast"})
ACCELERATE_FUNCTIONS = frozenset({"gather", "reduce", "broadcast", "wait_for_everyone", "gather_object",
                                  "broadcast_object_list", "pad_across_processes"})
# Collective only when the model is sharded (DeepSpeed ZeRO-3, FSDP): see the module docstring.
ACCELERATE_SHARDED = frozenset({"save_state", "save_model", "get_state_dict"})
# ... except `save_state`, which every process must call whatever the setup: accelerate 1.15.0
# `save_accelerator_state` writes each process's own random states (`random_states_<process_index>.pkl`,
# read back by `load_state` on that process), and under DeepSpeed or FSDP, which `accelerate config` picks
# at launch without a word in the code, it is a collective (accelerate#1171, diffusers#2606).
ACCELERATE_EVERY_PROCESS = frozenset({"save_state"})
# The HF Trainer's `push_to_hub` "needs to be executed on all processes": it calls `save_model` first (a
# collective under DeepSpeed ZeRO-3 or FSDP) and returns on every process but the world's first.
HF_TRAINER_EVERY_PROCESS = frozenset({"push_to_hub"})


@dataclass(frozen=True)
class LaunchDependent:
    """A framework save that is a collective only under a sharded launch: what picks it, what it does under
    plain DDP, who writes."""

    chosen_by: str
    under_ddp: str
    writer: str


LAUNCH_DEPENDENT: dict[str, LaunchDependent] = {
    "save_state": LaunchDependent(
        "`accelerate config`", "under plain DDP the other processes' random states are not saved, and "
        "resuming restores them on the main process only", "accelerate writes the model from the main "
        "process itself"),
    "push_to_hub": LaunchDependent(
        "the accelerate config or the Trainer's arguments", "it saves through `save_model` first, which "
        "then gathers the sharded weights with every rank (under plain DDP the others would only save and "
        "return)",
        "the Trainer saves and uploads from the main process itself"),
}
METRIC_SYNCS = frozenset({"compute", "sync"})
HF_TRAINER_COLLECTIVES = frozenset({"evaluate", "predict", "train"})
HF_TRAINER_SHARDED = frozenset({"save_model"})
# DTensor methods that gather or reduce across the mesh (module docstring): the name, and a word its
# arguments must hold for it to be one (empty: always)
DTENSOR_COLLECTIVES: dict[str, str] = {"full_tensor": "", "redistribute": "Replicate"}
DEEPSPEED_CONTEXTS = frozenset({"deepspeed.zero.GatheredParameters",
                                "deepspeed.zero.partition_parameters.GatheredParameters"})

@dataclass(frozen=True)
class Implicit:
    """A torch call that is a collective without a collective's name (module docstring): how findings name
    it, and the keywords (as written, `name=value`) that make it a local call."""

    label: str
    local_when: tuple[str, ...] = ()


_FSDP = ("torch.distributed.fsdp.FullyShardedDataParallel",
         "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel")
TORCH_IMPLICIT: dict[str, Implicit] = {
    **{f"torch.distributed.checkpoint.{module}{name}": Implicit(
        f"torch.distributed.checkpoint.{name}", ("use_collectives=False", "no_dist=True"))
       for module, names in (("", ("save", "load", "async_save", "save_state_dict", "load_state_dict")),
                             ("state_dict_saver.", ("save", "async_save", "save_state_dict")),
                             ("state_dict_loader.", ("load", "load_state_dict")))
       for name in names},
    "torch.distributed.device_mesh.init_device_mesh": Implicit("init_device_mesh"),
    "torch.distributed.init_device_mesh": Implicit("init_device_mesh"),
    "torch.nn.parallel.DistributedDataParallel": Implicit("DistributedDataParallel(...)"),
    "torch.nn.parallel.distributed.DistributedDataParallel": Implicit("DistributedDataParallel(...)"),
    **{f"{fsdp}.{name}": Implicit(f"FullyShardedDataParallel.{name}") for fsdp in _FSDP
       for name in ("summon_full_params", "full_optim_state_dict", "optim_state_dict",
                    "scatter_full_optim_state_dict")},
}
# Libraries whose functions of a collective's name are that collective (module docstring).
MIRRORS = {"deepspeed.comm": TORCH_COLLECTIVES,
           "ignite.distributed": frozenset({"all_reduce", "all_gather", "broadcast", "barrier"})}

# Text that must appear in a file for it to contain any collective: the checker's pre-filter.
TRIGGERS = ("distributed", "Distributed", "sync_dist", "all_gather", "barrier", "accelerat", "fabric",
            "torchmetrics", "strategy", "deepspeed", "transformers", "trl", "full_tensor", "redistribute",
            "device_mesh")

# The file shows a sharded setup, where saving and state dicts become collectives.
_SHARDED = re.compile(r"deepspeed|fsdp|FullyShardedDataParallel|automatic_checkpoint_naming", re.IGNORECASE)


class CollectiveCalls:
    def __init__(self, source: SourceFile):
        self.source = source

    @cached_property
    def metrics(self) -> MetricObjects:
        """The expressions of this file that hold a torchmetrics metric (metric_objects.py)."""
        return MetricObjects(self.source)

    @cached_property
    def uses_accelerate(self) -> bool:
        """accelerate, or a library whose trainers hold an `Accelerator` as `self.accelerator` (trl's
        trainers, transformers' `Trainer` since 4.28), which a subclass uses without importing accelerate."""
        return any(q.startswith(("accelerate", "trl", "transformers"))
                   for q in self.source.imports.names.values())

    @cached_property
    def uses_lightning(self) -> bool:
        return any(q.startswith(("lightning", "pytorch_lightning"))
                   for q in self.source.imports.names.values())

    @cached_property
    def uses_torch(self) -> bool:
        return any(q.startswith("torch") for q in self.source.imports.names.values())

    @cached_property
    def uses_hf_trainer(self) -> bool:
        return any(q.startswith(("transformers", "trl")) for q in self.source.imports.names.values())

    @cached_property
    def sharded(self) -> bool:
        """The code (not a comment) names DeepSpeed, FSDP or automatic checkpoint naming: an import, a
        keyword (`deepspeed=`, `fsdp_plugin=`, `automatic_checkpoint_naming=True`), a name or attribute."""
        if not _SHARDED.search(self.source.text):
            return False
        # a name in a negative comparison (`assert accelerator.distributed_type != DistributedType.FSDP`) is
        # the code ruling that setup out, not using it
        ruled_out = {
            id(sub) for node in ast.walk(self.source.tree)
            if isinstance(node, ast.Compare)
            and all(isinstance(op, (ast.NotEq, ast.IsNot, ast.NotIn)) for op in node.ops)
            for sub in ast.walk(node)
        }
        for node in ast.walk(self.source.tree):
            if id(node) in ruled_out:
                continue
            words: list[str] = []
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                words = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
            elif isinstance(node, ast.keyword) and node.arg:
                words = [node.arg]
            elif isinstance(node, ast.Name):
                words = [node.id]
            elif isinstance(node, ast.Attribute):
                words = [node.attr]
            if any(_SHARDED.search(word) for word in words):
                return True
        return False

    @cached_property
    def deepspeed_engines(self) -> frozenset[str]:
        """Names bound to the engine `deepspeed.initialize(...)` returns (the first of its tuple)."""
        if "deepspeed" not in self.source.text:
            return frozenset()
        engines: set[str] = set()
        for node in statements(self.source.tree.body):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                    self.source.resolve(node.value.func) == "deepspeed.initialize"):
                for target in node.targets:
                    first = (
                        target.elts[0]
                        if isinstance(target, (ast.Tuple, ast.List)) and target.elts
                        else target
                    )
                    name = dotted(first)
                    if name:
                        engines.add(name)
        return frozenset(engines)

    def label(self, call: ast.Call) -> str | None:
        func = call.func
        qual = self.source.resolve(func)
        if qual is not None:
            head, _, last = qual.rpartition(".")
            if head.startswith("torch.distributed") and last in TORCH_COLLECTIVES:
                return f"torch.distributed.{last}"
            if head.startswith("accelerate") and last in ACCELERATE_FUNCTIONS:
                return f"accelerate.{last}"
            if qual in DEEPSPEED_CONTEXTS:
                return "deepspeed.zero.GatheredParameters"
            if last in MIRRORS.get(head, ()):
                return qual
            implicit = TORCH_IMPLICIT.get(qual)
            if implicit is not None and not any(f"{kw.arg}={ast.unparse(kw.value)}" in implicit.local_when
                                                for kw in call.keywords):
                return implicit.label
        if not isinstance(func, ast.Attribute):
            return None
        method = func.attr
        receiver = dotted(func.value) or ""
        if method in ("log", "log_dict"):
            if is_true(_kw_value(call, "sync_dist")) and not is_true(_kw_value(call, "rank_zero_only")):
                return f"{receiver}.{method}(sync_dist=True)"
            return None
        last = receiver.rsplit(".", 1)[-1]
        if method == "all_gather" and receiver in ("self", "pl_module", "trainer.lightning_module",
                                                   "self.trainer.lightning_module"):
            return f"{receiver}.all_gather"
        if method == "save_checkpoint" and last.lstrip("_").endswith("trainer") and self.uses_lightning:
            # Lightning's Trainer.save_checkpoint ends in strategy.barrier("Trainer.save_checkpoint"); a file
            # that imports no Lightning holds some other trainer (a project's own, saving with torch.save)
            return f"{receiver}.save_checkpoint"
        if method == "save_checkpoint" and receiver in self.deepspeed_engines:
            return f"{receiver}.save_checkpoint"
        if last.lower().endswith("trainer") and self.uses_hf_trainer and (
                method in HF_TRAINER_COLLECTIVES or method in HF_TRAINER_EVERY_PROCESS
                or method in HF_TRAINER_SHARDED and self.sharded):
            return f"{receiver}.{method}"
        if last == "strategy" and method in STRATEGY_COLLECTIVES:
            return f"{receiver}.{method}"
        if last.lstrip("_") == "fabric" and method in FABRIC_COLLECTIVES:
            return f"{receiver}.{method}"
        if last.lstrip("_") == "accelerator" and self.uses_accelerate and (
                method in ACCELERATE_COLLECTIVES or method in ACCELERATE_EVERY_PROCESS
                or method in ACCELERATE_SHARDED and self.sharded):
            return f"{receiver}.{method}"
        if method in DTENSOR_COLLECTIVES and self.uses_torch and DTENSOR_COLLECTIVES[method] in "".join(
                ast.unparse(a) for a in (*call.args, *(k.value for k in call.keywords))):
            return f"DTensor.{method}"
        if method in METRIC_SYNCS and self.metrics.holds(func.value):
            return f"{receiver}.{method}"
        return None


def launch_dependent(label: str, calls: CollectiveCalls) -> bool:
    """A collective only where the launch picks DeepSpeed or FSDP, in a file that does not show which: the
    finding says so."""
    return label.rsplit(".", 1)[-1] in LAUNCH_DEPENDENT and not calls.sharded


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _kw_value(call: ast.Call, name: str) -> ast.expr | None:
    kw = keyword(call, name)
    return kw.value if kw else None
