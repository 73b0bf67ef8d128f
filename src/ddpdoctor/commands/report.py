"""`ddpdoctor report DIR [--html FILE]`: what a guarded run recorded, in the terminal or as a web page."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from rich.text import Text

from ..errors import InputError, UsageError
from ..exitcodes import FINDINGS, OK
from ..findings import Finding, Severity
from ..recording import load_run
from ..render.console import make_console
from ..render.html import render_html
from ..render.registry import choices_help, formats_for, render
from ..reports import RecordingReport

DESCRIPTION = """\
Render the directory written by `ddpdoctor run --report DIR`: the findings, and per rank the collectives it
entered. With --html FILE (or --format html, to stdout), a self-contained page (one swimlane per rank, the
divergence highlighted); --format json/sarif/github, the run's findings for tools.
Exits as `ddpdoctor run` did: 1 when the run had an error finding or did not finish (no report.json), 0
when it was clean or had warnings only (the audits'); --strict: 1 for warnings too, as `run --strict`."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="the --report DIR of a guarded run")
    parser.add_argument("--html", metavar="FILE", help="write the HTML timeline to FILE")
    parser.add_argument("--format", choices=formats_for(RecordingReport), default="text",
                        help=choices_help(RecordingReport))
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when the run has any finding, a warning too (as `run --strict` does)")


def run(args: argparse.Namespace) -> int:
    if args.html and args.format != "text":
        raise UsageError(f"--html FILE writes the page to a file, --format {args.format} prints to stdout: "
                         "give one of them")
    recording = load_run(args.directory)
    console = make_console(no_color=args.format != "text" or None)
    if args.html:
        _write_atomically(Path(args.html), render_html(recording))
        console.print(Text(f"wrote {args.html}"))
    else:
        render(RecordingReport(recording), args.format, console)
    return _exit_code(recording.findings, recording.finished, strict=args.strict)


def _exit_code(findings: list[Finding], finished: bool, *, strict: bool) -> int:
    """`ddpdoctor run`'s exit code for these findings: warnings leave it alone unless --strict."""
    if not finished or any(f.severity is Severity.ERROR for f in findings) or (strict and findings):
        return FINDINGS
    return OK


def _write_atomically(target: Path, text: str) -> None:
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{target}: folder {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        # mkstemp makes the file 0600; a page is for sharing: the mode open() would give it (0644 under the
        # usual umask 022)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(current)
    return current
