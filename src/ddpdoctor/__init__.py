"""ddpdoctor: catch distributed PyTorch training failures before, during and after the run.

The runtime entry points are imported lazily so that `import ddpdoctor` (and the checker and `explain`)
never imports torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "install", "audit_model", "audit_loader"]

_LAZY = {
    "install": ("ddpdoctor.guard", "install"),
    "audit_model": ("ddpdoctor.audits", "audit_model"),
    "audit_loader": ("ddpdoctor.audits", "audit_loader"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(module_name), attr)
    raise AttributeError(f"module 'ddpdoctor' has no attribute {name!r}")
