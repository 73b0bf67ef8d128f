"""Whether a dataset is split between the ranks before a loader reads it.

A `DistributedSampler` is one way to give each rank its own part of the data; sharding the dataset object
itself is another: Hugging Face `datasets`' `dataset.shard(num_shards, index)` and
`datasets.distributed.split_dataset_by_node(dataset, rank, world_size)` (and the same method on other
libraries' datasets) return the rank's part, which a plain shuffled loader may then read whole.

A dataset bound to such a call in the function that makes the loader is sharded. One that comes from
outside that function (a parameter, an attribute such as `self.dataset`) is taken as sharded when some
file of the program shards a dataset: the checker cannot tell which dataset object it was, and a missing
sampler is only worth a finding where nothing splits the data.
"""

from __future__ import annotations

import ast

from .source import SourceFile, call_name
from .values import scope_of_calls

SPLITTERS = ("split_dataset_by_node",)


def shards(call: ast.Call) -> bool:
    """`ds.shard(world_size, rank)`, `ds.shard(num_shards=..., index=...)`, `split_dataset_by_node(...)`."""
    name = call_name(call).rsplit(".", 1)[-1]
    if name in SPLITTERS:
        return True
    given = len(call.args) + len(call.keywords)
    return name == "shard" and isinstance(call.func, ast.Attribute) and given >= 2


def file_shards(source: SourceFile) -> bool:
    return ("shard" in source.text or "split_dataset_by_node" in source.text) and any(
        shards(c) for c in source.calls)


def sharded(source: SourceFile, dataset: ast.expr) -> bool:
    """The dataset a loader reads is its rank's part (see the module's docstring)."""
    if isinstance(dataset, ast.Call):
        return shards(dataset)
    outside = isinstance(dataset, ast.Attribute)
    if isinstance(dataset, ast.Name):
        bound = scope_of_calls(source)(dataset).at(dataset).get(dataset.id, frozenset())
        if bound and all(isinstance(b.value, ast.Call) and shards(b.value) for b in bound):
            return True
        outside = any(b.parameter is not None for b in bound)
    if not outside:
        return False
    project = source.project
    program = project.component(source.path) if project is not None else []
    return file_shards(source) or any(m.shards for m in program)
