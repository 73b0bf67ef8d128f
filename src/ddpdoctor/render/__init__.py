"""Renderers: the Findings of a command in, text for a person or a machine out.

`registry.FORMATS` names every format and the reports (`reports.py`) each can render; `registry.render`
renders one. The layouts for people live beside it: `text` (check), `guard_text` (the guard's panels),
`recording_text` and `html` (a recorded run), `explain_text` and `explain_markdown` (explain's diagnoses),
`markdown` (check's and a recorded run's findings); `json`, `sarif` and `github` render any report's Findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a package that `render.paths` alone costs nothing (every rank's audits import it)
    from rich.console import Console

    from ..findings import Finding


def render(findings: Sequence[Finding], fmt: str, console: Console) -> None:
    """Write plain `findings` (as `check` reports them, without its summary) to `console` in format `fmt`."""
    from ..reports import CheckReport
    from .registry import render as render_report

    render_report(CheckReport(tuple(findings), summary=False), fmt, console)
