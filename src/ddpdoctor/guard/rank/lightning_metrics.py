"""Attribute Lightning's metric syncs to the `self.log(..., sync_dist=True)` call that asked for them.

Lightning reduces epoch-level metrics long after `self.log` returned (in its logger connector, or in `fit`
after `lr_find`), so at the moment a sync collective hangs or fails no user frame is on the stack. The
guard wraps `LightningModule.log` (only if Lightning is already imported by the user's code: never
imported here) to remember where each synced metric was logged, and finds the metric a library collective
belongs to by looking for Lightning's `_ResultMetric` (`self.meta.name`) on the issuing stack.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from ...callsite import call_sites
from ...failsafe import failsafe
from ...records import MetricOrigin

# Keyed by (hook, name), then by name alone: one name may be logged from several hooks ("loss" from
# training_step and validation_step), and the sync of each must point at its own `self.log`. Lightning's
# `_ResultMetric.meta.fx` is the hook the value was logged in.
LOGGED: dict[Any, MetricOrigin] = {}
_MODULES = ("lightning.pytorch.core.module", "pytorch_lightning.core.module")


def wrap_log_if_imported() -> bool:
    """Wrap `LightningModule.log` in whichever Lightning flavour is imported; True if one was."""
    wrapped = False
    for module_name in _MODULES:
        module = sys.modules.get(module_name)
        cls = getattr(module, "LightningModule", None) if module else None
        if cls is None or getattr(cls.log, "__ddpdoctor_original__", None) is not None:
            continue
        cls.log = _wrap(cls.log)
        wrapped = True
    return wrapped


def unwrap() -> None:
    for module_name in _MODULES:
        module = sys.modules.get(module_name)
        cls = getattr(module, "LightningModule", None) if module else None
        original = getattr(getattr(cls, "log", None), "__ddpdoctor_original__", None)
        if cls is not None and original is not None:
            cls.log = original


def _wrap(log: Any) -> Any:
    @functools.wraps(log)
    def log_remembering_synced(self: Any, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("sync_dist"):
            # attribution is a nicety; never break logging
            with failsafe("lightning_metrics.log_remembering_synced"):
                site, _ = call_sites(2)
                if site is not None:
                    hook = getattr(self, "_current_fx_name", None) or site.function
                    LOGGED[(hook, name)] = LOGGED[name] = MetricOrigin(name, site.path, site.line, hook)
        return log(self, name, value, *args, **kwargs)

    log_remembering_synced.__ddpdoctor_original__ = log  # type: ignore[attr-defined]
    return log_remembering_synced


# Where `_ResultMetric` lives (lightning.pytorch and pytorch_lightning alike). Only frames of this file are
# looked into: reading `f_locals` builds a dict, and the guard asks on every Lightning-issued collective
# (Lightning broadcasts a SIGTERM flag every training step).
_RESULT_FILE = "logger_connector" + os.sep + "result.py"


def metric_in_stack(frame: Any, limit: int = 80) -> MetricOrigin | None:
    """The Lightning metric whose sync is running on this stack (innermost frame first), if any."""
    steps = 0
    while frame is not None and steps < limit:
        filename = frame.f_code.co_filename
        if filename.endswith(_RESULT_FILE) and "lightning" in filename:
            owner = frame.f_locals.get("self")
            meta = getattr(owner, "meta", None)
            name = getattr(meta, "name", None)
            if isinstance(name, str):
                fx = getattr(meta, "fx", None)
                base = name.split("/dataloader_idx_")[0]
                origin = (
                    LOGGED.get((fx, name)) or LOGGED.get((fx, base)) or LOGGED.get(name) or LOGGED.get(base)
                )
                if origin is not None:
                    return origin
                return MetricOrigin(name, None, None, fx)
        frame = frame.f_back
        steps += 1
    return None
