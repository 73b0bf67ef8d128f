"""A rank's files once its process is done: outside `ddpdoctor run` nobody reads the flight and meta
files afterwards, so they go (and the run directory, when this process made it or is its last user)."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from ..protocol import RunDir

if TYPE_CHECKING:
    from .runtime import GuardRuntime


def remove_files(runtime: GuardRuntime) -> None:
    if runtime.flight is not None:
        runtime.flight.close()
        if not runtime.config.launched and runtime.run_dir is not None and runtime.rank is not None:
            files = RunDir(runtime.run_dir)
            for path in files.rank_files(runtime.rank):
                files.remove(path)
    if not runtime.run_dir or runtime.config.launched:
        return
    if runtime.own_run_dir:
        shutil.rmtree(runtime.run_dir, ignore_errors=True)
        return
    try:
        os.rmdir(runtime.run_dir)  # only once the last rank of the job on this host is done
    except OSError:
        pass
