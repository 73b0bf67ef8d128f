"""Where `--remedy` cannot vouch for the result of a call, so it refuses the call (the finding, the job
stopped) rather than run it: a wrong number that the job then trains on is the worst thing it could do.

The remedy runs a collective on copies of its tensors placed on a device the group has a backend for,
then copies back what the collective wrote (the guard's `rank/remedy.py`). That is exact for every argument
shape but these:

- a reduction the backend that would run it lacks: on a CPU job the remedy runs the call on a gloo
  group, and gloo has no `PREMUL_SUM` (FSDP's gradient pre-division);
- two tensors the call writes that share memory: copied back one after the other, the later would
  overwrite part of the earlier (a gather list holding the same buffer twice).

An output that is a view of an input (an in-place `reduce_scatter_tensor` into a chunk of its input,
an in-place `all_gather_into_tensor`) is fine: the copies are separate, and only the output goes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Reductions gloo refuses (torch 2.13: "Cannot use ReduceOp.PREMUL_SUM with Gloo").
GLOO_LACKS = frozenset({"PREMUL_SUM"})


def _span(tensor: Any) -> tuple[int, int, int]:
    """(storage address, first byte, byte past the last) of the memory a tensor may touch: for a strided
    view, everything between its first and last element (so interleaved views count as overlapping, which
    errs on the side of refusing)."""
    size = tensor.element_size()
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.storage_offset() * size
    return tensor.untyped_storage().data_ptr(), start, start + extent * size


def overlapping(tensors: Sequence[Any]) -> bool:
    """Whether two of these tensors may touch the same bytes (empty ones touch none)."""
    spans = sorted(_span(t) for t in tensors if t.numel())
    return any(a[0] == b[0] and b[1] < a[2] for a, b in zip(spans, spans[1:], strict=False))


def refusal(reduce_op: str | None, on_gloo: bool, written: Sequence[Any]) -> str | None:
    """Why the remedy cannot guarantee this call's result, or None if it can.

    `reduce_op`: the call's reduction by name; `on_gloo`: whether the remedy would run it on a gloo group;
    `written`: the tensors the call writes."""
    if on_gloo and reduce_op in GLOO_LACKS:
        return (f"--remedy would run it on a gloo group, and gloo has no {reduce_op} reduction: refused "
                "rather than run with another one")
    if len(written) > 1 and overlapping(written):
        return ("two of the tensors it writes share memory, and copying the results back could overwrite one "
                "with the other: refused rather than return a wrong number")
    return None
