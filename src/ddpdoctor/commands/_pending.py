"""Placeholder for subcommands whose issue has not landed: one line, exit 2."""

from __future__ import annotations

import argparse
import sys

from ..exitcodes import ERROR


def pending(name: str, issue: int) -> tuple:
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(args: argparse.Namespace) -> int:
        print(f"ddpdoctor {name}: not available yet (tracked in issue #{issue})", file=sys.stderr)
        return ERROR

    return add_arguments, run
