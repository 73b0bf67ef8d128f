"""A rank's own findings (F1, the runtime audits'): kept for its report, and written to the run
directory's findings file for this rank, where the launcher collects them; outside `ddpdoctor run`
(install(), the Lightning callback), added to the `--report` directory's report.json at once, where no
launcher will."""

from __future__ import annotations

import os
from collections.abc import Iterator

from ...findings import Finding, dumps
from ..config import GuardConfig
from ..protocol import RunDir, atomic_write_json


class RankFindings:
    def __init__(self, config: GuardConfig) -> None:
        self.items: list[Finding] = []
        self.config = config  # read at each write: a later install() may name the report directory

    def __iter__(self) -> Iterator[Finding]:
        return iter(list(self.items))

    def add(self, finding: Finding, run_dir: str | None, rank: int | None) -> None:
        """Keep a finding not kept yet (by its message) and rewrite the findings file with it."""
        if any(kept.message == finding.message for kept in self.items):
            return
        self.items.append(finding)
        self._write(run_dir, rank)

    def replace(self, old: Finding, new: Finding, run_dir: str | None, rank: int | None) -> None:
        """Put `new` where `old` was kept (a warning whose durations grew), or keep it."""
        kept = [i for i, item in enumerate(self.items) if item.message == old.message]
        if not kept:
            self.add(new, run_dir, rank)
            return
        self.items[kept[0]] = new
        self._write(run_dir, rank, replaced=old)

    def _write(self, run_dir: str | None, rank: int | None, replaced: Finding | None = None) -> None:
        report_dir = self.config.report_dir
        if report_dir and not self.config.launched:
            from ..report import merge_report  # with the renderer's registry: not at every rank's start

            try:
                merge_report(report_dir, self.items, dropping=() if replaced is None else (replaced,))
            except OSError:
                pass  # an unwritable report directory: rank 0 tries again at exit
        if run_dir is None:
            return
        files = RunDir(run_dir)
        path = files.findings(rank, os.getpid()) if rank is not None else files.findings(os.getpid())
        try:
            atomic_write_json(path, None, text=dumps(self.items))
        except OSError:
            pass  # a full or vanished scratch directory: the finding still reaches this rank's report
