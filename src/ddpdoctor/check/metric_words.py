"""The vocabulary DDP103 reads epoch-end hooks with: the hooks, the calls that concatenate per-step
outputs, reduce them linearly, pass them through unchanged, only display them, or gather them across ranks."""

from __future__ import annotations

EPOCH_END_HOOKS = frozenset({
    "on_validation_epoch_end", "on_test_epoch_end", "on_train_epoch_end", "on_predict_epoch_end",
    "validation_epoch_end", "test_epoch_end", "training_epoch_end",
})
# Where per-batch results are collected (`self.outputs.append(...)` in `validation_step`).
STEP_HOOKS = frozenset({"on_validation_batch_end", "on_test_batch_end", "on_train_batch_end",
                        "on_predict_batch_end"})
CONCATENATORS = frozenset({"cat", "concat", "concatenate", "stack", "vstack", "hstack", "row_stack"})
CONCAT_LIBRARIES = ("torch.", "numpy.", "pandas.")
ACCUMULATORS = frozenset({"append", "extend", "update", "insert"})
RANK_AWARE = ("is_global_zero", "global_rank", "rank_zero_only", "local_rank")
GATHER_WORDS = ("gather", "all_reduce", "sync_ddp", "_sync_dist", "broadcast_object")
# Reductions for which the mean over equal shards (what `sync_dist=True` logs) is the whole set's value.
LINEAR_METHODS = frozenset({"mean", "sum", "nanmean", "nansum", "count", "numel", "count_nonzero"})
LINEAR_FUNCTIONS = frozenset(
    {
        "mean",
        "sum",
        "nanmean",
        "nansum",
        "fmean",
        "count_nonzero",
        # per-sample means: the mean over equal shards is the whole set's value
        "accuracy",
        "accuracy_score",
        "mean_squared_error",
        "mean_absolute_error",
        "mse_loss",
        "l1_loss",
        "cross_entropy",
        "nll_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "smooth_l1_loss",
        "huber_loss",
    }
)
# Calls that keep the values as they are (a view, a copy, another container, another dtype).
TRANSPARENT_METHODS = frozenset(
    {
        "float",
        "double",
        "half",
        "long",
        "int",
        "bool",
        "detach",
        "cpu",
        "cuda",
        "to",
        "view",
        "reshape",
        "flatten",
        "squeeze",
        "unsqueeze",
        "numpy",
        "tolist",
        "contiguous",
        "clone",
        "type",
        "to_numpy",
        "values",
        "ravel",
        "astype",
        "reset_index",
        "copy",
    }
)
TRANSPARENT_FUNCTIONS = frozenset({"tensor", "as_tensor", "array", "asarray", "list", "tuple", "float", "int",
                                   "DataFrame", "from_numpy"} | CONCATENATORS)
HARMLESS_FUNCTIONS = frozenset({"len", "print", "isinstance", "type", "str", "repr", "id", "bool"})
# Showing or writing this rank's outputs (an image grid, a plot, a file) is no metric of the whole set.
DISPLAY_WORDS = (
    "image",
    "plot",
    "grid",
    "figure",
    "hist",
    "video",
    "audio",
    "table",
    "save",
    "write",
    "dump",
    "show",
    "draw",
    "visual",
    "print",
)
HARMLESS_METHODS = frozenset(
    {
        "clear",
        "append",
        "extend",
        "update",
        "reset",
        "insert",
        "pop",
        "keys",
        "items",
        "size",
        "dim",
        "any",
        "all",
        "info",
        "debug",
        "warning",
        "write",
        "empty",
    }
)
