"""GitHub Actions workflow commands: each finding becomes an annotation on the pull request's diff."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..findings import Finding, Severity
from .registry import write

if TYPE_CHECKING:
    from rich.console import Console

    from ..reports import Report

_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(findings: Sequence[Finding]) -> str:
    lines = []
    for finding in findings:
        props = []
        loc = finding.location
        if loc is not None:
            props.append(f"file={_escape_property(loc.path)}")
            for key, value in (("line", loc.line), ("col", loc.column), ("endLine", loc.end_line),
                               ("endColumn", loc.end_column)):
                if value is not None:
                    props.append(f"{key}={value}")
        title = " ".join(part for part in (finding.code, finding.class_) if part)
        props.append(f"title={_escape_property(title)}")
        where = f"{loc.path}:{loc.line}:{loc.column}: " if loc and loc.line else ""
        message = f"{where}{finding.code + ' ' if finding.code else ''}{finding.message}"
        lines.append(f"::{_LEVEL[finding.severity]} {','.join(props)}::{_escape_data(message)}")
    return "\n".join(lines)


def print_github(report: Report, console: Console) -> None:
    write(console, render_github(report.findings))
