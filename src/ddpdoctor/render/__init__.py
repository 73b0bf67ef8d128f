"""Renderers: a list of `Finding`s in, text for a person or a machine out.

`text` writes to a rich console; `json`, `sarif` and `github` return strings. Every command that reports
findings (check, run, explain) picks one by name with `render`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..findings import Finding

if TYPE_CHECKING:
    from rich.console import Console

FORMATS = ("text", "json", "sarif", "github")


def render(findings: Sequence[Finding], fmt: str, console: Console, **options: object) -> None:
    """Write `findings` to `console` in format `fmt` (one of FORMATS)."""
    if fmt == "text":
        from .text import render_text

        render_text(findings, console, **options)  # type: ignore[arg-type]
        return
    if fmt == "json":
        from .json import render_json as to_string
    elif fmt == "sarif":
        from .sarif import render_sarif as to_string
    elif fmt == "github":
        from .github import render_github as to_string
    else:
        raise ValueError(f"unknown format {fmt!r}")
    text = to_string(findings)
    if text:
        console.file.write(text if text.endswith("\n") else text + "\n")
