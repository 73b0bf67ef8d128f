"""How fast is `ddpdoctor check`? Over the installed Lightning and torch sources, against pyflakes, same run.

    .venv/bin/python benchmarks/check_throughput.py [--packages lightning torch] [--jobs N] [--limit FILES]

Both tools check the same files, already read into memory (so disk speed does not count), one file after
the other in this process: that is the per-core throughput. It is computed from the CPU time this process
used (`time.process_time`), so other work on a shared machine slows the wall clock but not the figure;
the wall-clock time is printed beside it. With `--jobs N` (default: the cores) the
`ddpdoctor check` command itself is then timed on the same trees, end to end, with its process pool.
The sources are found with importlib (nothing is imported), never by a hard-coded path.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

TARGET_KLOC_PER_CORE = 40.0


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # a top-level package: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def read_sources(roots: list[Path], limit: int | None) -> list[tuple[str, str]]:
    from ddpdoctor.check.discovery import discover

    sources = []
    for path in discover([str(r) for r in roots], lambda _: False):
        try:
            sources.append((path, Path(path).read_bytes().decode("utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
        if limit and len(sources) >= limit:
            break
    return sources


def time_ddpdoctor(sources: list[tuple[str, str]]) -> tuple[float, float, int]:
    """Both passes of a whole run, as the command makes them: file-local rules and summaries, the project
    index, then the rules that ask the index (their files parsed again)."""
    from ddpdoctor.check.engine import Checker
    from ddpdoctor.check.project import ProjectFiles
    from ddpdoctor.check.registry import all_rules
    from ddpdoctor.check.runner import few_collections

    with few_collections():  # as the command checks (runner.py)
        return _two_passes(Checker(all_rules()), ProjectFiles(path for path, _ in sources), sources)


def _two_passes(checker, files, sources: list[tuple[str, str]]) -> tuple[float, float, int]:
    from ddpdoctor.check.engine import uses_project
    from ddpdoctor.check.project import ProjectIndex

    wall, cpu = time.perf_counter(), time.process_time()
    summaries = []
    codes: dict[str, list[str]] = {}
    for path, text in sources:
        result, summary = checker.first_pass_text(path, text, files)
        codes[path] = [f.code for f in result.findings]
        if summary is not None:
            summaries.append(summary)
    index = ProjectIndex(summaries, files)
    checker.project = index
    project_codes = {rule.code for rule in checker.rules if uses_project(rule)}
    for path, text in sources:
        if index.needs_project(path):  # its project rules' findings are replaced, as the runner does
            again = [f.code for f in checker.second_pass_text(path, text).findings]
            codes[path] = [c for c in codes[path] if c not in project_codes] + again
    return time.process_time() - cpu, time.perf_counter() - wall, sum(len(c) for c in codes.values())


class _Silent:
    """A pyflakes reporter that only counts."""

    def __init__(self) -> None:
        self.count = 0

    def unexpectedError(self, filename, msg):  # noqa: N802 - pyflakes' interface
        self.count += 1

    def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802
        self.count += 1

    def flake(self, message):
        self.count += 1


def time_pyflakes(sources: list[tuple[str, str]]) -> tuple[float, float, int] | None:
    try:
        from pyflakes import api
    except ImportError:
        return None
    reporter = _Silent()
    wall, cpu = time.perf_counter(), time.process_time()
    for path, text in sources:
        api.check(text, path, reporter)
    return time.process_time() - cpu, time.perf_counter() - wall, reporter.count


def time_cli(roots: list[Path], jobs: int) -> float:
    command = [sys.executable, "-m", "ddpdoctor", "check", "--isolated", "--exit-zero", "--statistics",
               "--no-progress", "--jobs", str(jobs), *map(str, roots)]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=900)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--packages", nargs="+", default=["lightning", "torch"])
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--limit", type=int, help="check at most this many files (a quick run)")
    parser.add_argument("--no-pyflakes", action="store_true")
    args = parser.parse_args()

    roots = [d for name in args.packages if (d := package_dir(name)) is not None]
    missing = [name for name in args.packages if package_dir(name) is None]
    if missing:
        print(f"not installed, skipped: {', '.join(missing)}", file=sys.stderr)
    if not roots:
        print("nothing to benchmark", file=sys.stderr)
        return 2
    sources = read_sources(roots, args.limit)
    lines = sum(text.count("\n") + 1 for _, text in sources)
    print(f"sources:    {', '.join(str(r) for r in roots)}")
    print(f"files:      {len(sources)}")
    print(f"lines:      {lines}")

    seconds, wall, findings = time_ddpdoctor(sources)
    ours = lines / seconds / 1000
    print(
        f"ddpdoctor:  {seconds:7.2f} s CPU ({wall:.2f} s wall)  {ours:7.1f} kLOC/s per core  ({findings} "
        "findings)"
    )
    if not args.no_pyflakes:
        flakes = time_pyflakes(sources)
        if flakes is None:
            print("pyflakes:   not installed")
        else:
            pf_seconds, pf_wall, messages = flakes
            theirs = lines / pf_seconds / 1000
            print(
                f"pyflakes:   {pf_seconds:7.2f} s CPU ({pf_wall:.2f} s wall)  {theirs:7.1f} kLOC/s per core  "
                f"({messages} messages)"
            )
            print(f"ratio:      ddpdoctor is {ours / theirs:.2f}x pyflakes' speed")
    verdict = "met" if ours >= TARGET_KLOC_PER_CORE else "NOT met"
    print(f"target:     >= {TARGET_KLOC_PER_CORE:.0f} kLOC/s per core: {verdict}")
    if args.jobs and not args.limit:
        wall = time_cli(roots, args.jobs)
        print(f"cli --jobs {args.jobs}: {wall:7.2f} s wall, {lines / wall / 1000:7.1f} kLOC/s "
              f"(start-up, discovery, reading and reporting included)")
    return 0 if ours >= TARGET_KLOC_PER_CORE else 1


if __name__ == "__main__":
    sys.exit(main())
