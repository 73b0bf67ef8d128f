"""The `ddpdoctor` command: argument parsing and dispatch only; each subcommand lives in `commands/`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from . import __version__
from .errors import InputError, UsageError
from .exitcodes import ERROR

# name -> (module under ddpdoctor.commands, one-line help). Modules are imported when the parser is
# built, so none of them may import torch at module level: `check` and `explain` must run without it.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check", "statically check Python sources for distributed-training bugs"),
    "explain": ("explain", "read a (multi-rank) training log and explain the failure"),
    "run": ("run", "run a training command under the runtime guard"),
    "report": ("report", "render what a guarded run recorded (HTML timeline)"),
    "env": ("env", "versions, backends, devices, environment variables, known-bad combinations"),
    "rules": ("rules", "list the failure classes and rule codes, or show one page"),
    "demo": ("demo", "a live tour of the catalogue's failures on this machine"),
}

DESCRIPTION = """\
ddpdoctor catches distributed PyTorch failures (DDP, Lightning, accelerate):
before the run (check), during it (run) and after the crash (explain).

exit codes: 0 ok, 1 findings, 2 usage or tool error"""


def _help_formatter(prog: str) -> argparse.HelpFormatter:
    """rich-argparse's formatter, imported only when help or a usage line is printed: `ddpdoctor run` does
    neither on its way to start the job, and the import would delay every job's start."""
    from rich_argparse import RawDescriptionRichHelpFormatter

    return RawDescriptionRichHelpFormatter(prog)


class _Parser(argparse.ArgumentParser):
    # the subcommands' parsers, by name (on the top-level parser): an unknown flag of `ddpdoctor check` is
    # found by the top-level parser, but the usage to show is `check`'s
    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's default is fine (usage + message + exit 2); only make the prefix consistent.
        self.print_usage(sys.stderr)
        self.exit(ERROR, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> _Parser:
    """The whole parser; with `only`, that subcommand's in full and the others' names alone: each command
    module imports what it needs (rich's markdown, the environment probe), and `ddpdoctor run` pays for
    every import on each job's start."""
    parser = _Parser(
        prog="ddpdoctor", description=DESCRIPTION, formatter_class=_help_formatter
    )
    parser.commands = {}
    parser.add_argument("--version", action="version", version=f"ddpdoctor {__version__}")
    # dest is not "command": `ddpdoctor run -- COMMAND ...` has a positional of that name.
    # prog given: argparse would otherwise format the usage to find it, which imports rich (0.1-0.2 s of
    # every `ddpdoctor run`'s start)
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=_Parser, prog="ddpdoctor")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(f"ddpdoctor.commands.{module_name}")
        child = sub.add_parser(
            name,
            help=help_text,
            description=getattr(module, "DESCRIPTION", help_text),
            formatter_class=_help_formatter,
        )
        module.add_arguments(child)
        child.set_defaults(_run=module.run)
        parser.commands[name] = child
    return parser


def _subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand named first on the command line, if that is all the parser needs to know."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in SUBCOMMANDS and argv and argv[0] == first else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(only=_subcommand(sys.argv[1:] if argv is None else list(argv)))
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = parser.commands.get(getattr(args, "subcommand", None) or "", parser)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return ERROR
    try:
        return int(args._run(args))
    except (UsageError, InputError) as exc:
        print(f"ddpdoctor {args.subcommand}: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", ERROR))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `ddpdoctor rules | head`: the reader left; nothing to report.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ERROR
    except Exception as exc:  # the last line of defence: never a traceback unless asked for
        if os.environ.get("DDPDOCTOR_DEBUG"):
            raise
        print(
            f"ddpdoctor {args.subcommand}: internal error: {type(exc).__name__}: {exc}\n"
            "  (this is a bug in ddpdoctor; run again with DDPDOCTOR_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
