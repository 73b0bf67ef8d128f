"""Audits: look at a model, its data loaders, its samplers and the default device, and say what will break
under DDP. One module per failure class; `job.py` is what they all ask about the job.

Nothing here runs a collective or changes what it inspects; every audit returns `Finding`s and leaves the
decision to stop to the caller (the Lightning callback and the guard only warn):

- `device_placement.py` — F3 `foreign-device-hooks` (and F1): parameters and buffers off the rank's device,
  modules whose placement accelerate (`_hf_hook`, `hf_device_map`) or bitsandbytes owns;
- `default_device.py`, `generators.py` — F2 `init-module-scope`: a default-device context around `fit`,
  generators on a non-CPU device;
- `samplers.py` — F7 `sampler-epoch`: a `DistributedSampler` whose epoch never changes, a shuffling loader
  that does not split the data between ranks;
- `checkpoints.py` (+ `mounts.py`) — F10 `checkpoint-race`: ranks writing one file between the same two
  collectives, judged in the job's store;
- `backend_device.py` — F1 `backend-device-mismatch`, checked by the guard at each collective.

The runtime side: `hooks.py` lists what the guard installs in every rank (`loader_hooks.py`, the savers of
`checkpoints.py`, the wrappers of `wrapping.py`), patched through `patching.py`, each given what the guard
hands them (`context.py`: where a finding goes, the job's store); `announce.py` prints a finding once in the
rank that found it.
"""

from __future__ import annotations

import importlib
from typing import Any

# Importing this package must not import torch (the guard's in-rank modules import `backend_device` from
# here before the program has imported torch): the public names load on first use.
_PUBLIC = {
    "AuditWarning": "job",
    "rank_device": "job",
    "EpochWatch": "samplers",
    "audit_loader": "samplers",
    "ForwardDeviceCheck": "device_placement",
    "audit_forward": "device_placement",
    "audit_model": "device_placement",
    "audit_default_device": "default_device",
    "audit_loader_generators": "generators",
    "iter_loaders": "generators",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
