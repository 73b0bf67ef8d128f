"""The documented JSON list (docs/json.md): one object per finding, as `Finding.to_dict` writes it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..findings import Finding, dumps
from .registry import write

if TYPE_CHECKING:
    from rich.console import Console

    from ..reports import Report


def render_json(findings: Sequence[Finding]) -> str:
    return dumps(findings, indent=2)


def print_json(report: Report, console: Console) -> None:
    write(console, render_json(report.findings))
