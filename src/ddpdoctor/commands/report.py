"""`ddpdoctor report DIR [--html FILE]`: what a guarded run recorded, in the terminal or as a web page."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import InputError
from ..exitcodes import FINDINGS, OK
from ..guard.judge.places import path_tail
from ..render.console import make_console
from ..render.html import render_html
from ..render.recording import RunRecording, load_run

DESCRIPTION = """\
Render the directory written by `ddpdoctor run --report DIR`: the findings, and per rank the collectives it
entered. With --html, a self-contained page (one swimlane per rank, the divergence highlighted).
Exit 1 when the run had findings or did not finish (no report.json), 0 when it was clean."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="the --report DIR of a guarded run")
    parser.add_argument("--html", metavar="FILE", help="write the HTML timeline to FILE")


def run(args: argparse.Namespace) -> int:
    recording = load_run(args.directory)
    console = make_console()
    if args.html:
        _write_atomically(Path(args.html), render_html(recording))
        console.print(Text(f"wrote {args.html}"))
    else:
        _print(console, recording)
    return FINDINGS if recording.findings or not recording.finished else OK


def _write_atomically(target: Path, text: str) -> None:
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{target}: folder {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _print(console: Console, recording: RunRecording) -> None:
    # Everything below but the labels came from the job (messages, fixes such as `Join([model])`, paths,
    # metric names): text to rich, never markup.
    if not recording.findings:
        console.print(Text(recording.status(), style="green" if recording.finished else "yellow"))
    for note in recording.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    for finding in recording.findings:
        console.print(f"[bold red]{escape(finding.class_)}[/] {escape(finding.message)}")
        for loc in finding.locations:
            console.print(Text(f"  {loc}"))
        if finding.fix:
            console.print(f"  [green]fix:[/] {escape(finding.fix.message)}")
    divergence = recording.divergence()
    for timeline in recording.ranks:
        table = Table(title=f"rank {timeline.rank}: last {len(timeline.records)} collective(s)", title_justify="left")
        for column in ("group", "seq", "op", "shapes", "dtypes", "state"):
            table.add_column(column)
        # the call site's file name and line are what the reader looks for: kept whole, a deep path shortened
        # from the left (its full form is in the findings above and in the rank file)
        table.add_column("call site", no_wrap=True, overflow="fold")
        for record in timeline.records[-20:]:
            style = "bold red" if record.position == divergence else None
            shapes = " ".join("[" + ", ".join(str(d) for d in shape) + "]" for shape in record.shapes)
            frame = record.site or record.library
            site = f"{path_tail(frame.path)}:{frame.line}" if frame is not None else ""
            cells = (record.group, str(record.seq), record.op, shapes, " ".join(record.dtypes), record.state.value, site)
            table.add_row(*(Text(cell) for cell in cells), style=style)
        console.print(table)
