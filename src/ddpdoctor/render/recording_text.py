"""`ddpdoctor report DIR` for people: the run's findings, then per job (a run may have several) and per rank a
table of the last collectives it entered, the first divergence in red."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..recording import RunRecording
from ..records import Frame
from ..reports import RecordingReport
from .paths import path_tail

# Why a rank's table would be empty: what the guard records is what Python calls.
NO_PYTHON_COLLECTIVE = (
    "no collective called from Python was recorded. DDP's gradient all-reduces are issued from C++ (its "
    "reducer, during backward), which the guard does not record call by call (docs/guard.md); a rank that "
    "stopped before its first collective records none either."
)


def call_site(library: Frame | None, user: Frame | None) -> str:
    """`lightning/.../ddp.py:330 ← train.py:41`: the library frame that made the call and the user's line
    that led to it; one of them when only one is known."""
    both = library is not None and user is not None
    shown = [f"{path_tail(frame.path, 36 if both else 60)}:{frame.line}"
             for frame in (library, user) if frame is not None]
    return " ← ".join(dict.fromkeys(shown))


def render_recording(report: RecordingReport, console: Console) -> None:
    recording = report.recording
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
    jobs = [recording, *recording.later_jobs]
    for job in jobs:
        if len(jobs) > 1:  # which job's ranks follow: a command that ran several jobs has a folder for each
            title = f"{job.job}/" if job.job else "the directory's top"
            console.print(Text(f"{title}: {len(job.ranks)} rank(s)", style="bold"))
        _rank_tables(job, console)


def _rank_tables(recording: RunRecording, console: Console) -> None:
    divergence = recording.divergence()
    for timeline in recording.ranks:
        if not timeline.records:
            console.print(Text(f"rank {timeline.rank}: {NO_PYTHON_COLLECTIVE}"))
            continue
        table = Table(
            title=f"rank {timeline.rank}: last {len(timeline.records)} collective(s)", title_justify="left"
        )
        for column in ("group", "seq", "op", "shapes", "dtypes", "state"):
            table.add_column(column)
        # the call site's file name and line are what the reader looks for: kept whole, a deep path shortened
        # from the left (its full form is in the findings above and in the rank file)
        table.add_column("call site", no_wrap=True, overflow="fold")
        for record in timeline.records[-20:]:
            style = "bold red" if record.position == divergence else None
            shapes = " ".join("[" + ", ".join(str(d) for d in shape) + "]" for shape in record.shapes)
            site = call_site(record.library, record.site)
            cells = (
                record.group,
                str(record.seq),
                record.op,
                shapes,
                " ".join(record.dtypes),
                record.state.value,
                site,
            )
            table.add_row(*(Text(cell) for cell in cells), style=style)
        console.print(table)
