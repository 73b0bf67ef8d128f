"""Read what a guarded run recorded (`ddpdoctor run --report DIR`) back into plain objects.

A report directory holds `report.json` (the run's findings, in the common `Finding` JSON) and, per job the run
saw, a folder `job-<n>/` with one `rank-<r>.jsonl` per rank (the last collectives that rank entered, oldest
first). The format is
documented in docs/guard.md; this module only reads it, tolerating missing optional keys, so the HTML and
text reports work on a directory from an older or newer guard.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .findings import Finding, loads
from .records import COMPARED, JOB_FOLDER, CallRecord, Frame

_RANK_FILE = re.compile(r"^rank-(\d+)\.jsonl$")
# Other spellings of "entered, not returned" that a recording may carry; read as the guard's "in".
WAITING_STATES = frozenset({"in", "waiting", "in-progress", "in_progress", "started"})
MAX_RECORD_BYTES = 64 * 1024 * 1024  # a recording is the last N calls per rank: anything bigger is not ours


def label(call: CallRecord) -> str:
    """`all_reduce [4]`: the op and its shapes, a timeline cell's text."""
    shapes = " ".join("[" + ", ".join(str(d) for d in shape) + "]" for shape in call.shapes)
    return f"{call.op} {shapes}".strip()


def place(frame: Frame | None) -> str | None:
    return f"{frame.path}:{frame.line}" if frame is not None else None


def _compared(call: CallRecord) -> tuple[Any, ...]:
    """What must be equal across ranks at one sequence number."""
    return tuple(getattr(call, name) for name in COMPARED)


@dataclass
class RankTimeline:
    rank: int
    records: list[CallRecord] = field(default_factory=list)

    def at(self, position: tuple[str, int]) -> CallRecord | None:
        for record in self.records:
            if record.position == position:
                return record
        return None


@dataclass
class RunRecording:
    directory: Path
    findings: list[Finding]
    ranks: list[RankTimeline]
    finished: bool = True  # report.json is there: the job's verdict (or its absence) was written
    notes: list[str] = field(default_factory=list)  # what was read around (a rank file cut short)
    job: str | None = None  # the job folder of these ranks' logs (`job-<n>`); None: the directory's top
    # the run's other jobs (a command that ran several), in the order they started: each has its own ranks
    # and no findings (the run's findings, every job's, are this recording's)
    later_jobs: list[RunRecording] = field(default_factory=list)

    def status(self) -> str:
        """One sentence for a recording without findings: clean, or not known to be."""
        if self.finished:
            return "No findings: the run was clean."
        return (
            "No report.json: the job had not finished (it is still running, or was stopped before it wrote "
            "its report), so whether it was clean is unknown. Below: what each rank recorded."
        )

    def positions(self) -> list[tuple[str, int]]:
        """Every (group, sequence number) some rank recorded, in the order the ranks issued them.
        Point-to-point calls (sequence number -1) pair with one peer and have no place here."""
        first: dict[tuple[str, int], tuple[int, int]] = {}
        for timeline in self.ranks:
            for record in timeline.records:
                if record.seq < 0:
                    continue
                order = (record.index if record.index >= 0 else record.seq, record.seq)
                if record.position not in first or order < first[record.position]:
                    first[record.position] = order
        return sorted(first, key=lambda position: (first[position], position))

    def groups(self) -> list[str]:
        return sorted({group for group, _ in self.positions()})

    def rank_state(self, rank: int) -> str | None:
        """What the guard's verdict says of a rank ("dead (killed by SIGSEGV at train.py:8 ...)", "in
        backward, not in a Python collective (...)"), for the cell where its lane has no collective."""
        for finding in self.findings:
            ranks = finding.facts.get("ranks") if isinstance(finding.facts, dict) else None
            row = ranks.get(str(rank)) if isinstance(ranks, dict) else None
            if isinstance(row, dict) and isinstance(row.get("state"), str):
                return str(row["state"])
        return None

    def divergence(self) -> tuple[str, int] | None:
        """The first position where the ranks' records disagree, or where a rank has none while a later
        one exists (it never got there). A finding's `facts` group and seq, if the guard set them, win."""
        for finding in self.findings:
            facts = finding.facts if isinstance(finding.facts, dict) else {}
            if isinstance(facts.get("seq"), int):
                return (str(facts.get("group") or ""), facts["seq"])
        for position in self.positions():
            records = [t.at(position) for t in self.ranks]
            present = [r for r in records if r is not None]
            if len({_compared(r) for r in present}) > 1:
                return position
            if len(present) < len(records):
                return position
        return None


def _site(data: dict[str, Any]) -> list[Any] | None:
    """The guard's `[path, line, function, library]`, or a `call_site` / `path` and `line` another writer
    used."""
    site = data.get("site") or data.get("call_site")
    if isinstance(site, list):
        return site
    if isinstance(site, dict) and site.get("path"):
        return [str(site["path"]), site.get("line") if isinstance(site.get("line"), int) else 0, "", None]
    if data.get("path"):
        return [str(data["path"]), data.get("line") if isinstance(data.get("line"), int) else 0, "", None]
    return None


def parse_record(data: dict[str, Any]) -> CallRecord:
    """One line of a rank log: the guard's `CallRecord` JSON, read leniently (a recording from an older
    or newer guard)."""
    if not isinstance(data.get("seq"), int):
        raise ValueError("record has no integer `seq`")
    state = str(data.get("state") or "")
    try:
        return CallRecord.from_json({
            **data, "site": _site(data), "library": data.get("library") or data.get("library_site"),
            "state": "in" if state in WAITING_STATES else state, "index": data.get("index", -1),
        })
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a collective record ({exc})") from None


def load_run(directory: str | Path) -> RunRecording:
    """Load a report directory; `InputError` with one clear sentence when it is not one. Each job's rank logs
    are in a folder of their own (`job-<n>/`), or, from a guard older than job folders, at the top."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"{root}: not a directory (expected the DIR given to `ddpdoctor run --report DIR`)")
    report = root / "report.json"
    folders = sorted(
        (int(m.group(1)), p) for p in root.iterdir() if (m := JOB_FOLDER.match(p.name)) and p.is_dir()
    )
    notes: list[str] = []
    jobs: list[tuple[str | None, list[RankTimeline]]] = []
    if _rank_files(root):
        jobs.append((None, _load_ranks(root, notes)))
    jobs += [(folder.name, _load_ranks(folder, notes)) for _, folder in folders]
    if not report.is_file() and not any(ranks for _, ranks in jobs):
        raise InputError(f"{root}: no report.json or rank-<r>.jsonl: not a ddpdoctor report directory")
    findings: list[Finding] = []
    if report.is_file():
        findings = _load_findings(report)
    first, *later = jobs or [(None, [])]
    return RunRecording(
        root, findings, first[1], finished=report.is_file(), notes=notes, job=first[0],
        later_jobs=[RunRecording(root, [], ranks, job=name) for name, ranks in later],
    )


def _rank_files(folder: Path) -> list[tuple[int, Path]]:
    return sorted(
        (int(m.group(1)), p) for p in folder.iterdir() if (m := _RANK_FILE.match(p.name)) and p.is_file()
    )


def _load_ranks(folder: Path, notes: list[str]) -> list[RankTimeline]:
    return [RankTimeline(rank, _load_records(path, notes)) for rank, path in _rank_files(folder)]


def _read_text(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise InputError(f"{path}: {path.stat().st_size} bytes, too large for a ddpdoctor recording")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text: not written by ddpdoctor") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


def _load_findings(path: Path) -> list[Finding]:
    text = _read_text(path)
    try:
        data = json.loads(text)
        if isinstance(data, dict) and "findings" in data:
            data = data["findings"]
        return loads(json.dumps(data))
    except ValueError as exc:
        raise InputError(f"{path}: not a ddpdoctor report: {exc}") from None


def _load_records(path: Path, notes: list[str]) -> list[CallRecord]:
    records = []
    text = _read_text(path)
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            records.append(parse_record(data))
        except ValueError as exc:
            if number == len(lines) and not text.endswith("\n") and records:
                # a rank stopped while writing its last line: the lines before it are whole
                notes.append(
                    f"{path.name}: its last line is cut short (line {number}); read up to line {number - 1}"
                )
                break
            raise InputError(f"{path}:{number}: not a ddpdoctor collective record: {exc}") from None
    records.sort(key=lambda r: (r.index, r.seq) if r.index >= 0 else (r.seq, r.seq))
    return records
