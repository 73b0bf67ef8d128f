"""Where a call or a rank is, in words a report shows: short paths, the line to name, what a stack is in."""

from __future__ import annotations

from collections.abc import Sequence

from ...callsite import COMPILED_GRAPH
from ...records import CallRecord, Frame, MetricOrigin
from ...render.paths import short_path


def where(call: CallRecord | None, metric: MetricOrigin | None = None) -> str:
    """The most useful place to name for a call: the logged metric, the user line, the library line."""
    metric = metric or (call.metric if call else None)
    library = call.library if call else None
    site = call.site if call else None
    issued = ""
    if library and (library.library not in (None, "torch", "python") or not site):
        issued = f"{short_path(library.path)}:{library.line}"
    if metric:
        text = f"the sync of metric `{metric.name}`, logged with sync_dist=True"
        if metric.path:
            text += f" at {short_path(metric.path)}:{metric.line}"
        if metric.hook:
            text += f" in {metric.hook}"
        return text + (f" ({issued})" if issued else "")
    parts = [issued] if issued else []
    if site:
        parts.append(
            f"{short_path(site.path)}:{site.line}"
            + (f" in {site.function}" if site.function != "<module>" else "")
        )
    return ", called from ".join(parts) if parts else "an unknown place"


def location_of(
    call: CallRecord | None, metric: MetricOrigin | None, stack: Sequence[Frame]
) -> tuple[str, int] | None:
    """The (path, line) a finding names for a rank: the logged metric, the call's user or library line, the
    innermost user frame of its stack, its innermost frame."""
    metric = metric or (call.metric if call else None)
    if metric and metric.path and metric.line is not None:
        return metric.path, metric.line
    if call:
        for frame in (call.site, call.library):
            if frame:
                return frame.path, frame.line
    for frame in stack:
        if frame.library is None:
            return frame.path, frame.line
    if stack:
        return stack[0].path, stack[0].line
    return None


def user_line(stack: Sequence[Frame]) -> str | None:
    """"train.py:12 in load_batch": the innermost frame of a stack that the user wrote."""
    user = next((f for f in stack if f.library is None), None)
    return f"{short_path(user.path)}:{user.line} in {user.function}" if user else None


def in_backward(stack: Sequence[Frame]) -> bool:
    """Whether a stack is in autograd's backward pass (the innermost frames, torch's)."""
    for frame in stack[:4]:
        if frame.library != "torch":
            return False
        if frame.function in ("_engine_run_backward", "backward") and "autograd" in frame.path:
            return True
    return False


def in_compiled_graph(stack: Sequence[Frame]) -> bool:
    return any(frame.library == COMPILED_GRAPH for frame in stack)
