"""The documented JSON list (docs/json.md): one object per finding, as `Finding.to_dict` writes it."""

from __future__ import annotations

from collections.abc import Sequence

from ..findings import Finding, dumps


def render_json(findings: Sequence[Finding]) -> str:
    return dumps(findings, indent=2)
