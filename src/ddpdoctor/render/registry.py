"""Every output format, by name, and which reports it can render: the one place `--format` choices come from.

A `Format` maps report types (`reports.py`) to the function that renders one, named as `module:function`
under `ddpdoctor.render` and imported on first use: building the command line imports this registry, and
neither it nor the guard (which prints its report through it from inside every rank) should pay for rich or
for formats it does not print. Each function takes `(report, console)` and writes to the console: rich text
through it, machine formats as a string to `console.file`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..reports import CheckReport, ExplainReport, GuardReport, RecordingReport

if TYPE_CHECKING:
    from rich.console import Console

    from ..reports import Report

_EVERY_REPORT = (CheckReport, GuardReport, RecordingReport, ExplainReport)


@dataclass(frozen=True)
class Format:
    name: str
    help: str  # a few words, for `--help`
    renderers: Mapping[type, str]  # report type -> "module:function" under ddpdoctor.render

    def renderer(self, report_type: type) -> Callable[[Any, Console], None]:
        module, _, function = self.renderers[report_type].partition(":")
        return getattr(importlib.import_module(f"ddpdoctor.render.{module}"), function)  # type: ignore[no-any-return]


def _each(target: str) -> dict[type, str]:
    return dict.fromkeys(_EVERY_REPORT, target)


FORMATS: tuple[Format, ...] = (
    Format("text", "for people, in the terminal", {
        CheckReport: "text:render_check",
        GuardReport: "guard_text:render_guard",
        RecordingReport: "recording_text:render_recording",
        ExplainReport: "explain_text:render_explain",
    }),
    Format("json", "the Finding list of docs/json.md", _each("json:print_json")),
    Format("sarif", "SARIF 2.1.0, for code scanning", _each("sarif:print_sarif")),
    Format("github", "GitHub Actions annotations", _each("github:print_github")),
    Format("markdown", "to paste into an issue or a pull request", {
        CheckReport: "markdown:print_findings_markdown",
        RecordingReport: "markdown:print_findings_markdown",
        ExplainReport: "explain_markdown:print_markdown",
    }),
    Format("html", "a self-contained page", {RecordingReport: "html:print_html"}),
)
_BY_NAME = {fmt.name: fmt for fmt in FORMATS}


def formats_for(report_type: type) -> tuple[str, ...]:
    """The format names that can render a report of this type, in the registry's order (`text` first)."""
    return tuple(fmt.name for fmt in FORMATS if report_type in fmt.renderers)


def choices_help(report_type: type) -> str:
    """`--format`'s help text for a command whose report is of this type."""
    names = formats_for(report_type)
    described = ", ".join(f"{name} ({_BY_NAME[name].help})" for name in names)
    return f"output format: {described}; default: {names[0]}"


def render(report: Report, fmt: str, console: Console) -> None:
    """Write `report` to `console` in format `fmt`; a format that cannot render this report is a usage
    error."""
    found = _BY_NAME.get(fmt)
    if found is None or type(report) not in found.renderers:
        raise UsageError(
            f"no {fmt!r} format for this report; choose from {', '.join(formats_for(type(report)))}"
        )
    found.renderer(type(report))(report, console)


def write(console: Console, text: str) -> None:
    """A machine format's text, as it is (no markup, no wrapping), ending with one newline."""
    if text:
        console.file.write(text if text.endswith("\n") else text + "\n")
