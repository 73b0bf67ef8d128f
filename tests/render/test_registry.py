"""One registry of formats: every command's `--format` choices are the formats that exist for its report."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ddpdoctor.cli import build_parser
from ddpdoctor.errors import UsageError
from ddpdoctor.findings import Finding
from ddpdoctor.render.registry import FORMATS, formats_for, render
from ddpdoctor.reports import CheckReport, ExplainReport, GuardReport, RecordingReport


def format_choices(command: str) -> tuple[str, ...]:
    parser = build_parser().commands[command]
    (action,) = [a for a in parser._actions if "--format" in a.option_strings]
    return tuple(action.choices or ())


@pytest.mark.parametrize("command, report_type", [("check", CheckReport), ("explain", ExplainReport),
                                                  ("report", RecordingReport)])
def test_each_commands_formats_come_from_the_registry(command: str, report_type: type) -> None:
    choices = format_choices(command)
    assert choices == formats_for(report_type)
    assert choices[0] == "text"
    # the findings-only formats exist for every report; the layouts made for one kind, only there
    assert {"json", "sarif", "github"} <= set(choices)


def test_every_format_renders_some_report_and_every_report_has_text() -> None:
    assert all(fmt.renderers for fmt in FORMATS)
    assert len({fmt.name for fmt in FORMATS}) == len(FORMATS)
    for report_type in (CheckReport, GuardReport, RecordingReport, ExplainReport):
        assert "text" in formats_for(report_type)
        for name in formats_for(report_type):  # each named function exists
            fmt = next(f for f in FORMATS if f.name == name)
            assert callable(fmt.renderer(report_type))


def test_rendering_a_report_in_a_format_it_does_not_have_is_a_usage_error() -> None:
    console = Console(file=io.StringIO())
    with pytest.raises(UsageError, match="no 'html' format for this report; choose from text, json"):
        render(CheckReport((Finding(class_="x", message="m"),)), "html", console)
    with pytest.raises(UsageError, match="no 'pdf' format"):
        render(GuardReport(()), "pdf", console)
