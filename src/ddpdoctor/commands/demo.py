"""`ddpdoctor demo`: the catalogue's failures, live on this machine, each caught by check, the guard and
explain."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ..errors import InputError, UsageError
from ..exitcodes import FINDINGS, OK
from ..findings import Severity
from ..render.console import make_console

DESCRIPTION = """\
A self-verifying tour of the failure classes, on this machine (CPU, gloo, 2 ranks). For each class that
fails on a CPU: `ddpdoctor check` on the broken script (the finding), the broken script under
`ddpdoctor run` (the guard's live report), `ddpdoctor explain` on the log of the broken script run
without the guard (the diagnosis), and the fixed script (it passes, and the guard stays silent). Classes
that need GPUs show their static check only. A summary table ends the tour.

The examples ship with ddpdoctor (examples/ in a checkout, examples/README.md); the guard
decides after --hang-after 5 s here (real jobs: the default of 5 minutes).

exit codes: 0 every expected detection happened, 1 one did not, 2 usage error"""

OK_MARK = "[green]✓[/]"
FAIL_MARK = "[bold red]✗[/]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only", action="append", default=[], metavar="CLASS",
        help="run only this class (F4, collective-divergence, DDP101, ...); repeatable",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the classes and what the demo shows for each"
    )
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), metavar="N",
        help="runs at a time (each is a small 2-rank job; default: 2)",
    )
    parser.add_argument(
        "--keep", metavar="DIR",
        help="keep every run in DIR/<run>/: its log (output.log), how it ended (run.json), its guard report",
    )
    parser.add_argument(
        "--examples", metavar="DIR", help="the examples folder (default: the ones installed with ddpdoctor)"
    )


def run(args: argparse.Namespace) -> int:
    from ..demo.manifest import EXAMPLES, ManifestError, all_examples

    folder = Path(args.examples) if args.examples else EXAMPLES
    if not folder.is_dir():
        raise InputError(
            f"no examples folder at {folder}: the examples ship inside the ddpdoctor package (reinstall it), "
            "or pass --examples DIR"
        )
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    try:
        examples = all_examples(folder)
    except ManifestError as exc:
        raise InputError(str(exc)) from exc
    if not examples:
        raise InputError(f"no example.toml under {folder}")
    examples = _select(examples, args.only)
    # In a log file (CI, `| tee`) rich would wrap at 80 columns; the guard's report is 100+ wide.
    console = make_console()
    if args.list:
        _print_list(console, examples)
        return OK
    return _tour(console, examples, args)


def _select(examples: list, keys: list[str]) -> list:
    from ..catalogue import CATALOGUE

    order = {failure.slug: n for n, failure in enumerate(CATALOGUE)}
    examples = sorted(examples, key=lambda e: order.get(e.slug, len(order)))
    if not keys:
        return examples

    wanted: set[str] = set()
    for key in keys:
        classes = CATALOGUE.lookup(key)
        if not classes:
            raise UsageError(f"no failure class named {key!r} (`ddpdoctor demo --list` shows them)")
        wanted.update(c.slug for c in classes)
    return [e for e in examples if e.slug in wanted]


def _failure(slug: str):
    from ..catalogue import CATALOGUE

    return CATALOGUE.get(slug)


def _print_list(console: Console, examples: list) -> None:
    from ..demo.manifest import cuda_device_count

    cuda = cuda_device_count()
    table = Table(title="ddpdoctor demo: the failure classes", title_justify="left")
    for name in ("id", "class", "check", "guard", "explain", "on this machine"):
        table.add_column(name, no_wrap=name != "on this machine", overflow="fold")
    for example in examples:
        failure = _failure(example.slug)
        codes = sorted({c for run in example.runs for c in (run.check or ())})
        guard = sorted({_class_id(run.guard) for run in example.runs if run.guard})
        explain = sorted({_class_id(run.explain) for run in example.runs if run.explain})
        runnable = [r for r in example.runs if r.runnable_here(cuda) and r.expect == "fail"]
        here = (
            "runs" if runnable else f"check only: the failure needs {max(r.gpus for r in example.runs)} GPUs"
        )
        table.add_row(failure.id, example.slug, ", ".join(codes) or "—", ", ".join(guard) or "—",
                      ", ".join(explain) or "—", here)
    console.print(table)
    console.print("Run one: [bold]ddpdoctor demo --only F4[/]")


def _tour(console: Console, examples: list, args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..demo.manifest import cuda_device_count, stop_all_runs
    from ..demo.tour import DEMO_HANG_AFTER, collect, start_tours

    cuda = cuda_device_count()
    workdir = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="ddpdoctor-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    err = make_console(stderr=True)
    console.print(
        f"[bold]ddpdoctor demo[/]: {len(examples)} failure classes from "
        f"{escape(str(examples[0].folder.parent))}, "
        f"{args.jobs} run(s) at a time, guard verdicts after {DEMO_HANG_AFTER:g} s"
    )
    started_at = time.monotonic()
    tours = []
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    )
    pool = ThreadPoolExecutor(max_workers=args.jobs, thread_name_prefix="demo-run")

    def terminate(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with progress:
            planned = start_tours(examples, cuda, workdir, pool)
            total = sum(len(futures) for _, futures in planned)
            task = progress.add_task("running the examples", total=total)
            for _, futures in planned:
                for future in futures:
                    future.add_done_callback(lambda _f: progress.advance(task))
            for tour, futures in planned:
                progress.update(task, description=f"waiting for {tour.example.slug}")
                collect(tour, futures)
                _print_class(console, tour)
                tours.append(tour)
    except KeyboardInterrupt:
        err.print("ddpdoctor demo: interrupted; stopping every run it started")
        raise
    finally:
        # Runs live in sessions of their own, which Ctrl-C does not reach: drop the queued ones, kill the
        # running ones (a no-op after a complete tour), then wait for the worker threads.
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all_runs()
        pool.shutdown(wait=True)
        stop_all_runs()  # a run a worker started between the cancel and the kill
        signal.signal(signal.SIGTERM, previous)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    _print_summary(console, tours, time.monotonic() - started_at)
    if args.keep:
        console.print(f"logs and guard reports kept in {escape(str(workdir))} "
                      "(`ddpdoctor report DIR/<run>/report --html page.html` draws one)")
    return OK if all(t.ok for t in tours) else FINDINGS


def _mark(ok: bool) -> str:
    return OK_MARK if ok else FAIL_MARK


def _rel(path: Path) -> str:
    """The path as the user would type it: through a checkout's examples/ link when there is one."""
    here = Path.cwd()
    for base, shown in ((_linked_examples(here), Path("examples")), (here, Path("."))):
        if base is None:
            continue
        try:
            return str(shown / path.resolve().relative_to(base))
        except ValueError:
            continue
    return str(path)


def _linked_examples(here: Path) -> Path | None:
    """What `./examples` points at, when it is a checkout's link to the packaged examples."""
    link = here / "examples"
    return link.resolve() if link.is_symlink() else None


def _class_id(slug: str | None) -> str:
    """F4, F6a, ...: short enough for the summary table; the legend is the first column."""
    return _failure(slug).id if slug else "nothing"


def _print_class(console: Console, tour) -> None:
    from ..guard.report import render as render_guard_report
    from ..render.text import render_text

    failure = _failure(tour.example.slug)
    console.print()
    console.rule(f"[bold]{failure.id} {tour.example.slug}[/]: {escape(failure.title)}", align="left")
    console.print(escape(tour.example.summary))
    for check in tour.checks:
        found = ", ".join(sorted(check.codes)) or "nothing"
        expected = ", ".join(check.expected) or "nothing"
        note = "" if check.ok else f" (expected {expected})"
        console.print(f"{_mark(check.ok)} [bold]check[/]   {escape(_rel(check.script))}: {found}{note}")
        if check.findings and check.expected:
            render_text(check.findings, console, show_fix=True)
    for outcome in tour.guarded:
        verdict = outcome.guard_class or "no report"
        console.print(
            f"{_mark(outcome.ok)} [bold]guard[/]   ddpdoctor run -- {escape(_command(outcome))}: {verdict}, "
            + (f"job stopped after {outcome.result.seconds:.1f} s" if _stopped_by_guard(outcome)
               else f"warned while the job ran to its end ({outcome.result.seconds:.1f} s)")
            + f" (exit {outcome.result.returncode})"
            + ("" if outcome.ok else f" (expected {outcome.run.guard})")
        )
        if outcome.guard_findings:
            render_guard_report(outcome.guard_findings[:1], stream=console.file)
        elif not outcome.ok:
            console.print(escape(outcome.result.output[-1500:]), style="dim")
    for outcome in tour.broken:
        _print_broken(console, outcome)
    for outcome in tour.fixed:
        state = "passed" if outcome.behaved else f"did not pass ({'; '.join(outcome.result.problems())})"
        guard = ", guard silent" if outcome.guarded and outcome.ok else (
            f", guard reported {outcome.guard_class}" if outcome.guarded and outcome.guard_class else "")
        rerun = (
            " (passed on a second run: the first time, after the script had finished, torch aborted in its "
            "exit-time cleanup)"
            if outcome.result.rerun
            else ""
        )
        console.print(f"{_mark(outcome.ok)} [bold]fixed[/]   {escape(outcome.run.script.name)} {state}"
                      f"{guard} ({outcome.result.seconds:.1f} s){rerun}")
        if not outcome.behaved:
            console.print(escape(outcome.result.output[-1500:]), style="dim")
    for note in tour.skipped:
        console.print(f"[dim]-  skipped {escape(note)}[/]")


def _command(outcome) -> str:
    run = outcome.run
    if run.launcher == "torchrun":
        return f"torchrun --nproc-per-node {run.nproc} {_rel(run.script)}"
    return f"python {_rel(run.script)}"


def _print_broken(console: Console, outcome) -> None:
    from ..explain.report import fixes

    run = outcome.run
    timeout = run.env.get("DDPDOCTOR_EXAMPLE_TIMEOUT")
    how = f"{outcome.result.seconds:.1f} s" + (
        f", process group timeout cut to {timeout} s" if timeout else ""
    )
    if not outcome.behaved:
        console.print(f"{FAIL_MARK} [bold]broken[/]  {escape(run.script.name)} did not fail as documented: "
                      f"{escape('; '.join(outcome.result.problems()))}")
        console.print(escape(outcome.result.output[-1500:]), style="dim")
        return
    match = run.output.search(outcome.result.output)
    shown = match.group(0) if match else ""
    console.print(f"{OK_MARK} [bold]broken[/]  {escape(run.script.name)} without the guard: exit "
                  f"{outcome.result.returncode} after {how}: [italic]{escape(shown[:160])}[/]")
    if not run.explain:
        return
    if not outcome.diagnoses:
        console.print(f"{FAIL_MARK} [bold]explain[/] found nothing in the log (expected {run.explain})")
        return
    best = outcome.diagnoses[0]
    console.print(
        f"{_mark(outcome.ok)} [bold]explain[/] ddpdoctor explain {escape(outcome.log.name)} -> "
        f"[bold]{best.slug}[/] (confidence {best.finding.confidence:.2f})"
        + ("" if outcome.ok else f" (expected {run.explain})")
    )
    if best.explanation:
        console.print(Padding(Text(best.explanation[0]), (0, 0, 0, 10)))
    fix = fixes(best)
    if fix:
        console.print(Padding(Text("fix: " + fix[0], style="green"), (0, 0, 0, 10)))


def _stopped_by_guard(outcome: Any) -> bool:
    """Whether the guard stopped the run (an error), or only warned (its audits) and let it run on."""
    return any(f.severity is Severity.ERROR for f in outcome.guard_findings)


def _print_summary(console: Console, tours: list, seconds: float) -> None:
    table = Table(title=f"ddpdoctor demo: summary ({seconds:.0f} s)", title_justify="left")
    # The class column never shrinks (it is the legend of the F-ids in the other cells); the others wrap.
    labels = [f"{_failure(t.example.slug).id} {t.example.slug}" for t in tours]
    table.add_column("class", no_wrap=True, overflow="fold", min_width=max(map(len, labels), default=0))
    # On an 80-column terminal the other columns wrap, never cut: a rule code shown as "DDP1…" says nothing.
    codes = [code for t in tours for c in t.checks for code in c.expected]
    table.add_column("check", overflow="fold", min_width=max(map(len, codes), default=1) + 2)
    for name in ("guard", "explain", "fixed"):
        table.add_column(name, overflow="fold")
    table.add_column("stopped by the guard", justify="right", overflow="fold")
    table.add_column("unguarded", overflow="fold")
    for tour in tours:
        failure = _failure(tour.example.slug)
        check = "\n".join(f"{_mark(c.ok)} {code}" for c in tour.checks for code in c.expected) or "—"
        guard = "\n".join(f"{_mark(o.ok)} {_class_id(o.guard_class)}" for o in tour.guarded) or "—"
        explain = "\n".join(
            f"{_mark(o.ok)} {_class_id(o.explain_class)}" for o in tour.broken if o.run.explain
        ) or "—"
        fixed = " ".join(_mark(o.ok) + (" run twice" if o.result.rerun else "") for o in tour.fixed) or "—"
        stopped = (
            "\n".join(
                f"{o.result.seconds:.1f} s" + ("" if _stopped_by_guard(o) else " (warned only)")
                for o in tour.guarded
            )
            or "—"
        )
        without = (
            "\n".join(
                f"{o.result.seconds:.1f} s"
                + (
                    f" ({o.run.env['DDPDOCTOR_EXAMPLE_TIMEOUT']} s timeout)"
                    if "DDPDOCTOR_EXAMPLE_TIMEOUT" in o.run.env
                    else ""
                )
                for o in tour.broken
                if o.run.guard
            )
            or "—"
        )
        if tour.skipped and not (tour.broken or tour.guarded):
            fixed = "needs GPUs"
        table.add_row(f"{failure.id} {tour.example.slug}", check, guard, explain, fixed, stopped, without)
    console.print()
    console.print(table)
    rerun = [f"{t.example.slug}/{o.run.script.name}" for t in tours for o in t.fixed if o.result.rerun]
    if rerun:
        console.print(
            f"Run twice: {escape(', '.join(rerun))}. The first run printed its result and then died in "
            "torch's exit-time cleanup (\"terminate called without an active exception\"), a torch 2.13 "
            "abort that does not come from the example; the second run passed."
        )
    missed = [t.example.slug for t in tours if not t.ok]
    if missed:
        console.print(f"{FAIL_MARK} expected detections missing for: {', '.join(missed)}")
    else:
        console.print(
            f"{OK_MARK} every expected detection happened. Without a timeout cut short for the demo, the "
            "unguarded hangs above would wait 30 minutes (gloo, Lightning) or 10 (NCCL)."
        )
    sys.stdout.flush()
