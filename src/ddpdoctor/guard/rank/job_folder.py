"""The folder of the report directory that one job's rank logs go in (`job-<n>`, protocol.JOB_FOLDER): a
report directory that several jobs write to (a command running two torchruns one after the other, a pytest
session making and destroying groups) keeps every job's logs. The first rank of the job to ask makes the
folder and names it in the job's store; the others read the name there, so one job's ranks agree on it
whichever host they run on."""

from __future__ import annotations

import os
from typing import Any

from ...records import JOB_FOLDER
from ..protocol import RunDir, StoreKeys


def claim(store: Any, keys: StoreKeys, report_dir: str, rank: int) -> str | None:
    """This job's folder name, made by whichever rank claims it first (store reads: milliseconds); None
    where it could not be made (the logs then go to the top of the directory)."""
    holder = store.compare_set(keys.job_namer, "", str(rank)).decode()
    if holder != str(rank):
        return store.get(keys.job).decode() or None  # waits until the claiming rank has named it
    try:
        name = new_folder(report_dir)
    except OSError:
        name = ""
    store.set(keys.job, name)  # also when there is none: the other ranks wait for this key
    return name or None


def new_folder(report_dir: str) -> str:
    """Make the next `job-<n>` folder in `report_dir`; its name."""
    os.makedirs(report_dir, exist_ok=True)
    numbers = [int(found.group(1)) for name in os.listdir(report_dir) if (found := JOB_FOLDER.match(name))]
    number = max(numbers, default=0) + 1
    while True:
        try:
            os.mkdir(os.path.join(report_dir, f"job-{number}"))
            return f"job-{number}"
        except FileExistsError:  # another job of the same directory made it first
            number += 1


def logs_folder(report_dir: str, job: str | None) -> str:
    """Where a rank of job `job` writes its log (the report directory itself when the job has no folder)."""
    return os.path.join(report_dir, job) if job else report_dir


def note(run_dir: str | None, rank: int, job: str) -> None:
    """Tell `ddpdoctor run` which folder this rank's job has (it writes a dead rank's log there)."""
    if run_dir:
        with open(RunDir(run_dir).job_of(rank), "w", encoding="utf-8") as handle:
            handle.write(job)


def noted(run_dir: str, rank: int) -> str | None:
    """The folder a rank noted (`note`), if it did and the name is one of ours."""
    try:
        with open(RunDir(run_dir).job_of(rank), encoding="utf-8") as handle:
            name = handle.read().strip()
    except OSError:
        return None
    return name if JOB_FOLDER.match(name) else None
