"""`ddpdoctor explain LOG...`: name the failure in a (multi-rank) training log, its culprit rank and the
fix."""

from __future__ import annotations

import argparse
import sys

from ..errors import UsageError
from ..exitcodes import FINDINGS, OK
from ..render.registry import choices_help, formats_for
from ..reports import ExplainReport

DESCRIPTION = """\
Read one job's logs (torchrun, Lightning, accelerate; several files or `-` for stdin), find the root
failure among the victims and explain it: what happened (with the ranks, sequence numbers, devices and
frames from this log), why, and how to fix it. Logs are streamed, so size does not matter.

A log that shows a job starting and then just stopping (killed by `timeout`, a scheduler or Ctrl-C, or
ending mid-output after a SIGKILL) with no error in it is diagnosed as a likely hang, with lower
confidence: which ranks printed what last, when, and the commands to run next.

exit codes: 0 diagnosed, 1 nothing recognised (one line says what the log is), 2 unreadable input"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file(s) of one job, or - for stdin")
    parser.add_argument("--format", choices=formats_for(ExplainReport), default="text",
                        help=choices_help(ExplainReport))
    parser.add_argument("--limit", type=int, default=0, metavar="N", help="show only the N best diagnoses")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="when nothing is recognised, list what was looked for")


def run(args: argparse.Namespace) -> int:
    from ..explain import explain_paths
    from ..explain.report import explain_report
    from ..render.console import make_console
    from ..render.explain_text import nothing_found
    from ..render.registry import render

    if args.logs.count("-") > 1:
        raise UsageError("stdin (-) can be read only once")
    if args.limit < 0:
        raise UsageError("--limit must be >= 0")
    explanation = explain_paths(list(args.logs))
    if args.limit:
        explanation.diagnoses = explanation.diagnoses[: args.limit]
    report = explain_report(explanation, verbose=args.verbose)
    render(report, args.format, make_console(soft_wrap=False, no_color=args.format != "text" or None))
    if not report.findings:
        if args.format != "text":  # the text format says it in its place; the others keep stdout for tools
            print(nothing_found(report), file=sys.stderr)
        return FINDINGS
    return OK
