"""The HTML timeline of a guarded run: one self-contained page (no network, no CDN).

One swimlane per rank, collectives in sequence order, the first divergence highlighted, the findings and
their fixes above. Everything that came from the job (paths, messages, stacks, op names) is text to us:
it is escaped into the markup, and the script only ever moves it with `textContent`, never as HTML.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ..findings import Finding
from ..recording import RunRecording, label, place
from ..records import CallRecord, CallState
from ..reports import RecordingReport
from .paths import path_tail
from .registry import write

if TYPE_CHECKING:
    from rich.console import Console

_CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d5dae3; --ok: #e8f3ea; --bad: #fde2e1; --badline: #d4302b; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 24px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.meta { color: var(--muted); margin-bottom: 16px; }
.finding { border-left: 4px solid var(--badline); background: #fff6f5; padding: 8px 12px; margin: 8px 0; }
.finding.warning { border-color: #d98b00; background: #fffaf0; }
.finding .cls { font-family: ui-monospace, monospace; color: var(--muted); }
.finding ul { margin: 4px 0 0 18px; padding: 0; }
.fix { margin-top: 6px; } .fix b { color: #1b6e34; }
pre, code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
.timeline { overflow-x: auto; border: 1px solid var(--line); border-radius: 6px; }
table.lanes { border-collapse: collapse; }
table.lanes th, table.lanes td { border-right: 1px solid var(--line); padding: 0; }
table.lanes thead th { font-weight: 600; color: var(--muted); padding: 4px 8px; font-size: 12px;
  border-bottom: 1px solid var(--line); }
table.lanes th.rank { position: sticky; left: 0; background: #fff; padding: 6px 10px; text-align: left;
  white-space: nowrap; border-bottom: 1px solid var(--line); }
.lane td { border-bottom: 1px solid var(--line); }
.call { margin: 4px; padding: 4px 6px; border-radius: 4px; background: var(--ok); cursor: pointer;
  font-family: ui-monospace, monospace; font-size: 12px; white-space: nowrap; min-width: 90px; }
.call:hover, .call:focus { outline: 2px solid #5a8dee; }
.call .site { color: var(--muted); font-size: 11px; }
.call.waiting { background: #fff3cd; }
.call.divergent { background: var(--bad); outline: 2px solid var(--badline); }
.missing { margin: 4px; padding: 4px 6px; color: var(--muted); font-style: italic; font-size: 12px; }
.missing.divergent { background: var(--bad); outline: 2px dashed var(--badline); }
.missing[data-detail] { cursor: pointer; font-style: normal; color: inherit; }
th.divergent { color: var(--badline) !important; }
#detail { margin-top: 12px; border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px;
  white-space: pre-wrap; min-height: 3em; }
"""

# Clicking a call shows its details; the text is read from a data attribute and written with textContent.
_JS = """
document.querySelectorAll('.call, .missing[data-detail]').forEach(function (el) {
  function show() { document.getElementById('detail').textContent = el.dataset.detail; }
  el.addEventListener('click', show);
  el.addEventListener('keydown', function (e) { if (e.key === 'Enter') { show(); } });
});
"""


def _finding_html(finding: Finding) -> str:
    locations = "".join(f"<li><code>{escape(str(loc))}</code></li>" for loc in finding.locations)
    evidence = "".join(
        f"<li><code>{escape(ev.text)}</code></li>" for ev in finding.evidence[:20]
    )
    fix = f'<div class="fix"><b>Fix:</b> {escape(finding.fix.message)}</div>' if finding.fix else ""
    return (
        f'<div class="finding {escape(finding.severity.value)}">'
        f'<div><span class="cls">{escape(finding.class_)}{" " + escape(finding.code) if finding.code else ""}'
        f"</span> — {escape(finding.message)}</div>"
        f'{f"<ul>{locations}</ul>" if locations else ""}{fix}'
        f'{f"<details><summary>evidence</summary><ul>{evidence}</ul></details>" if evidence else ""}'
        "</div>"
    )


def _detail_text(rank: int, record: CallRecord) -> str:
    lines = [f"rank {rank} · seq {record.seq} · {record.op}", f"state: {record.state.value}"]
    shapes = ["[" + ", ".join(str(d) for d in shape) + "]" for shape in record.shapes]
    for name, values in (("shapes", shapes), ("dtypes", record.dtypes), ("devices", record.devices)):
        if values:
            lines.append(f"{name}: {', '.join(values)}")
    if record.reduce_op:
        lines.append(f"reduce op: {record.reduce_op}")
    if record.root is not None:
        lines.append(f"root: {record.root}")
    if record.group:
        lines.append(f"group: {record.group}")
    if record.site:
        lines.append(f"called at: {place(record.site)}")
    if record.library:
        lines.append(f"issued by: {place(record.library)}")
    return "\n".join(lines)


def _cell(rank: int, record: CallRecord | None, divergent: bool, state: str | None = None) -> str:
    mark = " divergent" if divergent else ""
    if record is None:
        if divergent and state:
            # where the rank is instead (dead, exited, in backward): the verdict's words, the first in the
            # cell
            detail = escape(f"rank {rank}: {state}", quote=True)
            head = state.split(";")[0]
            head += ")" * (head.count("(") - head.count(")"))
            return (f'<td><div class="missing{mark}" tabindex="0" title="{detail}" data-rank="{rank}" '
                    f'data-detail="{detail}">{escape(head)}</div></td>')
        return f'<td><div class="missing{mark}">—</div></td>'
    state = " waiting" if record.state is CallState.IN else ""
    called_at = place(record.site)
    # in the lane a deep path keeps its file name and line (`…/checkout/train.py:31`); whole in the tooltip
    shown = f"{path_tail(record.site.path, 40)}:{record.site.line}" if record.site is not None else ""
    site = f'<div class="site">{escape(shown)}</div>' if called_at else ""
    detail = escape(_detail_text(rank, record), quote=True)
    title = escape(label(record) + (f" at {called_at}" if called_at else ""), quote=True)
    return (
        f'<td><div class="call{state}{mark}" tabindex="0" title="{title}" data-seq="{record.seq}" '
        f'data-rank="{rank}" data-detail="{detail}">{escape(label(record))}{site}</div></td>'
    )


def _timeline(recording: RunRecording) -> tuple[str, str]:
    """One job's lanes as a table, and its one-line summary."""
    positions = recording.positions()
    divergence = recording.divergence()
    several = len(recording.groups()) > 1  # then each column says which group's count it is
    header = "".join(
        f'<th class="{"divergent" if position == divergence else ""}" scope="col">'
        f'#{position[1]}{escape(" group " + position[0]) if several else ""}</th>'
        for position in positions
    )
    lanes = []
    for timeline in recording.ranks:
        state = recording.rank_state(timeline.rank)
        cells = "".join(
            _cell(timeline.rank, timeline.at(position), position == divergence, state)
            for position in positions
        )
        lanes.append(
            f'<tr class="lane" data-rank="{timeline.rank}"><th class="rank" scope="row">rank {timeline.rank}'
            f"</th>{cells}</tr>"
        )
    summary = f"{len(recording.ranks)} rank(s), {len(positions)} collective(s) recorded" + (
        f"; first divergence at collective #{divergence[1]} of group {divergence[0]}"
        if divergence is not None
        else ""
    )
    table = (
        '<div class="timeline"><table class="lanes">'
        f'<thead><tr><th class="rank">rank</th>{header}</tr></thead>'
        f'<tbody>{"".join(lanes)}</tbody></table></div>'
    )
    return table, summary


def render_html(recording: RunRecording, *, title: str = "ddpdoctor run report") -> str:
    jobs = [recording, *recording.later_jobs]
    timelines = []
    for job in jobs:
        table, summary = _timeline(job)
        # a run of several jobs (a folder each): one timeline per job, named by its folder
        name = job.job or "top of the directory"
        heading = f"Timeline: {name} ({summary})" if len(jobs) > 1 else "Timeline"
        timelines.append(f"<h2>{escape(heading)}</h2>\n{table}")
    summary = _timeline(recording)[1] if len(jobs) == 1 else f"{len(jobs)} jobs"
    findings = "".join(_finding_html(f) for f in recording.findings) or f"<p>{escape(recording.status())}</p>"
    findings += "".join(f'<p class="note">{escape(note)}</p>' for note in recording.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" \
content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{escape(title)}</title><style>{_CSS}</style></head>
<body>
<h1>{escape(title)}</h1>
<div class="meta">{escape(str(recording.directory))} · {escape(summary)}</div>
<h2>Findings</h2>
<section id="findings">{findings}</section>
{"".join(timelines)}
<div id="detail">Click a collective to see its call site and stack.</div>
<script>{_JS}</script>
</body></html>
"""


def print_html(report: RecordingReport, console: Console) -> None:
    write(console, render_html(report.recording))
