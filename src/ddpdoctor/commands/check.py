"""`ddpdoctor check [PATH...]`: the static checker, with ruff's command line (docs/check.md)."""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console

from ..errors import UsageError
from ..exitcodes import FINDINGS, OK
from ..findings import Applicability, Finding
from ..render.console import make_console
from ..render.registry import choices_help, formats_for, render
from ..reports import CheckReport

if TYPE_CHECKING:
    from ..check.project import ProjectIndex

DESCRIPTION = """\
Check Python sources for distributed-training bugs before the job is launched.

Paths are files or directories (default: the current directory). Directories are searched for *.py,
skipping .git, virtual environments and site-packages unless named. Configuration: \\[tool.ddpdoctor] in
pyproject.toml (select, ignore, extend-select, exclude, per-file-ignores). Silence one line with
`# noqa: DDP101`.

exit codes: 0 nothing found, 1 findings (or files that could not be read or parsed: E902/E999),
2 usage or configuration error"""


def _codes(value: str) -> list[str]:
    return [part.strip().upper() for part in value.split(",") if part.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to check (default: .)")
    parser.add_argument("--select", type=_codes, metavar="CODES",
                        help="comma-separated codes or prefixes to enable (replaces the configured set)")
    parser.add_argument("--extend-select", type=_codes, metavar="CODES", default=[],
                        help="codes or prefixes to enable in addition")
    parser.add_argument("--ignore", type=_codes, metavar="CODES", default=[],
                        help="codes or prefixes to disable")
    parser.add_argument("--format", choices=formats_for(CheckReport), default="text",
                        help=choices_help(CheckReport))
    parser.add_argument(
        "--statistics", action="store_true", help="print a count per rule instead of findings"
    )
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    parser.add_argument("--fix", action="store_true", help="apply safe fixes")
    parser.add_argument("--unsafe-fixes", action="store_true", help="with --fix or --diff: unsafe fixes too")
    parser.add_argument("--diff", action="store_true", help="show the fixes as a diff, write nothing")
    parser.add_argument("--jobs", "-j", type=int, metavar="N", help="worker processes (default: the cores)")
    parser.add_argument("--config", metavar="FILE", help="a pyproject.toml to read instead of searching")
    parser.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    parser.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    parser.add_argument("--quiet", "-q", action="store_true", help="only the findings, no summary")


def run(args: argparse.Namespace) -> int:
    from ..check import config as config_module
    from ..check.discovery import discover
    from ..check.engine import TOOL_CODES
    from ..check.registry import all_rules
    from ..check.runner import check_files, default_jobs

    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    settings = config_module.load(args.config, args.isolated)
    if args.select is not None:
        settings.select = args.select
    settings.extend_select += args.extend_select
    settings.ignore += args.ignore
    registry = all_rules()
    enabled = sorted(settings.enabled(registry))

    paths = args.paths or ["."]
    files = list(discover(paths, settings.excluded))
    if not files:
        raise UsageError(f"no Python files found under {', '.join(paths)}")
    context = _imported_modules(paths, files, settings.excluded)
    fixing = args.fix or args.diff
    out = make_console(soft_wrap=True, no_color=args.format != "text" or None)
    err = make_console(stderr=True)
    if context and not args.quiet:
        modules = f"{len(context)} local module{'s' if len(context) != 1 else ''}"
        importers = "the checked files import" if len(files) != 1 else "the checked file imports"
        err.print(f"Read {modules} that {importers}, for what they call; findings are reported only in the "
                  "checked files.", highlight=False, markup=False)
    jobs = args.jobs or default_jobs()
    indexes: list[
        ProjectIndex
    ] = []  # the run's project index, to check a fixed file again with the other files known
    show_progress = err.is_terminal and not args.no_progress and len(files) + len(context) >= 200
    if show_progress:
        from rich.progress import Progress

        with Progress(console=err, transient=True, auto_refresh=False) as progress:
            task = progress.add_task("checking", total=len(files) + len(context))
            last = [0.0]

            def advance() -> None:
                # Redraw at most ten times a second: no refresh thread (the pool forks), little output.
                progress.update(task, advance=1)
                now = time.monotonic()
                if now - last[0] > 0.1:
                    last[0] = now
                    progress.refresh()

            results = check_files(
                files, enabled, jobs=jobs, keep_text=fixing, advance=advance, indexes=indexes, context=context
            )
    else:
        results = check_files(files, enabled, jobs=jobs, keep_text=fixing, indexes=indexes, context=context)

    findings: list[Finding] = []
    diffs: list[str] = []
    fixed_count = 0
    for result in results:
        ignored = settings.ignored_for(result.path)
        kept = [f for f in result.findings
                if f.code in TOOL_CODES or not any(f.code.startswith(c.upper()) for c in ignored)]
        if fixing and result.text is not None:
            kept, applied, diff = _fix(result.path, result.text, kept, args, enabled, ignored,
                                       indexes[0] if indexes else None)
            fixed_count += applied
            if diff:
                diffs.append(diff)
        findings.extend(kept)
    findings.sort(key=Finding.sort_key)

    if args.diff:
        for diff in diffs:
            out.out(diff, end="", highlight=False)
        if not args.quiet:
            err.print(f"Would fix {fixed_count} finding{'s' if fixed_count != 1 else ''}.", highlight=False)
        return FINDINGS if diffs and not args.exit_zero else OK
    if args.statistics:
        _statistics(out, findings, registry, args.unsafe_fixes)
    else:
        render(
            CheckReport(tuple(findings), fixed_count, args.unsafe_fixes, summary=not args.quiet),
            args.format,
            out,
        )
    return FINDINGS if findings and not args.exit_zero else OK


def _imported_modules(paths: list[str], files: list[str], excluded: Callable[[str], bool]) -> list[str]:
    """The local modules that the files named on the command line import and the run does not check
    itself: read for the project index only (check/local_imports.py). Named directories are checked whole."""
    from ..check.local_imports import local_imports

    named = [path for path in paths if os.path.isfile(path)]
    if not named:
        return []
    checked = {os.path.realpath(path) for path in files}
    return [path for path in local_imports(named, excluded).modules if os.path.realpath(path) not in checked]


def _fix(path: str, text: str, findings: list[Finding], args: argparse.Namespace, enabled: list[str],
         ignored: list[str], project: ProjectIndex | None = None) -> tuple[list[Finding], int, str]:
    """Apply the fixes of one file (or, with --diff, only compute them); the findings that remain."""
    from ..check.engine import Checker
    from ..check.fixes import apply_edits, unified_diff, write_atomically

    fixed, applied = apply_edits(text, findings, args.unsafe_fixes)
    if not applied:
        return findings, 0, ""
    diff = unified_diff(_diff_path(path), text, fixed)
    if args.diff:
        return [f for f in findings if f not in applied], len(applied), diff
    write_atomically(path, fixed)
    remaining = Checker(enabled, project).check_text(path, fixed)
    remaining = [f for f in remaining if not any(f.code.startswith(c.upper()) for c in ignored)]
    return remaining, len(applied), diff


def _diff_path(path: str) -> str:
    """The path a diff header names after `a/` and `b/`, as git writes it: relative to the working directory
    when the file is under it, otherwise absolute without its leading slash (`a/tmp/x.py`, not
    `a//tmp/x.py`)."""
    absolute = os.path.abspath(path)
    try:
        relative = os.path.relpath(absolute)
    except ValueError:  # another drive (Windows)
        relative = absolute
    if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
        return relative.replace(os.sep, "/")
    return absolute.replace(os.sep, "/").lstrip("/")


def _statistics(out: Console, findings: list[Finding], registry: dict, unsafe: bool) -> None:
    counts = Counter(f.code for f in findings)
    fixable = Counter(
        f.code for f in findings
        if f.fix and f.fix.edits and (unsafe or f.fix.applicability == Applicability.SAFE)
    )
    for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        name = registry[code].name if code in registry else "input-error"
        mark = "[*]" if fixable[code] else "   "
        out.print(f"{count:>5}\t{code:<7}\t{mark} {name}", highlight=False, markup=False)
