"""What counts as a collective: a call every rank of the group must make, in the same order.

`CollectiveCalls(source).label(call)` names the collective a call issues (`dist.all_reduce`,
`self.log(sync_dist=True)`, `accelerator.gather`, ...) or returns None. Point-to-point calls (`send`,
`recv`, ...) are deliberately not collectives here: a rank test is how p2p code says who sends and who
receives, so flagging them would be wrong almost every time.
"""

from __future__ import annotations

import ast
from functools import cached_property

from .source import SourceFile, dotted, is_true, keyword, statements

TORCH_COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "new_group", "new_subgroups", "init_process_group", "_all_gather_base", "_reduce_scatter_base",
})
STRATEGY_COLLECTIVES = frozenset({"barrier", "broadcast", "reduce", "all_gather", "reduce_boolean_decision"})
# `fabric.save` "must be called on all processes" (it ends in a barrier).
FABRIC_COLLECTIVES = frozenset({"barrier", "broadcast", "all_gather", "all_reduce", "save"})
ACCELERATE_COLLECTIVES = frozenset({"gather", "reduce", "wait_for_everyone", "gather_for_metrics",
                                    "pad_across_processes", "broadcast"})
ACCELERATE_FUNCTIONS = frozenset({"gather", "reduce", "broadcast", "wait_for_everyone", "gather_object",
                                  "broadcast_object_list", "pad_across_processes"})
METRIC_SYNCS = frozenset({"compute", "sync"})

# Text that must appear in a file for it to contain any collective: the checker's pre-filter.
TRIGGERS = ("distributed", "sync_dist", "all_gather", "barrier", "accelerat", "fabric", "torchmetrics",
            "strategy")


class CollectiveCalls:
    def __init__(self, source: SourceFile):
        self.source = source

    @cached_property
    def metric_holders(self) -> frozenset[str]:
        """`self.acc` / `acc` bound to a torchmetrics object somewhere in this file."""
        holders: set[str] = set()
        if "torchmetrics" not in self.source.text:
            return frozenset()
        for node in statements(self.source.tree.body):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                qual = self.source.resolve(node.value.func) or ""
                if qual.startswith("torchmetrics."):
                    for target in node.targets:
                        name = dotted(target)
                        if name:
                            holders.add(name)
        if holders:
            # A metric object handed to `self.log` is computed by Lightning on every rank at epoch end; a
            # compute() on rank 0 alone before that joins the same gather, so it does not hang.
            for call in self.source.calls:
                if isinstance(call.func, ast.Attribute) and call.func.attr in ("log", "log_dict"):
                    for arg in [*call.args, *(kw.value for kw in call.keywords)]:
                        for sub in ast.walk(arg):
                            if isinstance(sub, (ast.Attribute, ast.Name)):
                                holders.discard(dotted(sub) or "")
        return frozenset(holders)

    @cached_property
    def uses_accelerate(self) -> bool:
        return any(q.startswith("accelerate") for q in self.source.imports.names.values())

    def label(self, call: ast.Call) -> str | None:
        func = call.func
        qual = self.source.resolve(func)
        if qual is not None:
            head, _, last = qual.rpartition(".")
            if head.startswith("torch.distributed") and last in TORCH_COLLECTIVES:
                return f"torch.distributed.{last}"
            if head.startswith("accelerate") and last in ACCELERATE_FUNCTIONS:
                return f"accelerate.{last}"
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
        if method == "save_checkpoint" and last.lstrip("_").endswith("trainer"):
            # Lightning's Trainer.save_checkpoint ends in strategy.barrier("Trainer.save_checkpoint").
            return f"{receiver}.save_checkpoint"
        if last == "strategy" and method in STRATEGY_COLLECTIVES:
            return f"{receiver}.{method}"
        if last.lstrip("_") == "fabric" and method in FABRIC_COLLECTIVES:
            return f"{receiver}.{method}"
        if last.lstrip("_") == "accelerator" and method in ACCELERATE_COLLECTIVES  and self.uses_accelerate:
            return f"{receiver}.{method}"
        if method in METRIC_SYNCS and receiver in self.metric_holders:
            return f"{receiver}.{method}"
        return None


def _kw_value(call: ast.Call, name: str) -> ast.expr | None:
    kw = keyword(call, name)
    return kw.value if kw else None
