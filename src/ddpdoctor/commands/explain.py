"""`ddpdoctor explain LOG...`: name the failure in a (multi-rank) training log, its culprit rank and the fix."""

from __future__ import annotations

import argparse
import sys

from ..errors import UsageError
from ..exitcodes import FINDINGS, OK

DESCRIPTION = """\
Read one job's logs (torchrun, Lightning, accelerate; several files or `-` for stdin), find the root
failure among the victims and explain it: what happened (with the ranks, sequence numbers, devices and
frames from this log), why, and how to fix it. Logs are streamed, so size does not matter.

exit codes: 0 diagnosed, 1 nothing recognised (prints what was looked for), 2 unreadable input"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file(s) of one job, or - for stdin")
    parser.add_argument(
        "--format",
        choices=("text", "json", "markdown"),
        default="text",
        help="text (terminal), json (tools) or markdown (paste into an issue); default: text",
    )
    parser.add_argument("--limit", type=int, default=0, metavar="N", help="show only the N best diagnoses")


def run(args: argparse.Namespace) -> int:
    from ..explain import explain_paths
    from ..explain.render import nothing_found, print_text, to_json, to_markdown

    if args.logs.count("-") > 1:
        raise UsageError("stdin (-) can be read only once")
    if args.limit < 0:
        raise UsageError("--limit must be >= 0")
    explanation = explain_paths(list(args.logs))
    if args.limit:
        explanation.diagnoses = explanation.diagnoses[: args.limit]
    if args.format == "json":
        print(to_json(explanation))
    elif args.format == "markdown":
        print(to_markdown(explanation), end="")
    if not explanation.diagnoses:
        if args.format == "text":
            print(nothing_found(explanation))
        else:
            print(nothing_found(explanation), file=sys.stderr)
        return FINDINGS
    if args.format == "text":
        from rich.console import Console

        print_text(explanation, Console(highlight=False, soft_wrap=False))
    return OK
