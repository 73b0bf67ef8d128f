"""What the guard leaves on disk and in the job's store, named in one place.

The run directory (`ddpdoctor run`'s, or the one `install()` picks per job) holds, per rank, its meta,
flight, exit and fault files and its findings, and for the job the report's files and the marks that
say who reported and printed. Every JSON file in it is written whole or not at all
(`atomic_write_json`): the launcher may SIGKILL a rank mid-write, and a reader must never see half a file.
"""

from __future__ import annotations

import json
import os
from typing import Any


def atomic_write_json(path: str, data: Any, *, text: str | None = None) -> None:
    """Write `data` as JSON (or `text` as it is) to `path` through a temporary file of this process, then
    rename it into place: readers see the old file or the new one, never a part."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            if text is not None:
                handle.write(text)
            else:
                json.dump(data, handle, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
