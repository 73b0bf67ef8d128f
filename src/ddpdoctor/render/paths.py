"""Paths as a report shows them: short for an installed file, the tail of a deep one in a narrow column."""

from __future__ import annotations

import os

_SITE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def short_path(path: str) -> str:
    """`torch/distributed/...` for an installed file, a relative path for the user's."""
    for marker in _SITE_DIRS:
        at = path.find(marker)
        if at >= 0:
            return path[at + len(marker) :]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    if rel.startswith(".." + os.sep + ".."):
        return path
    return rel


def path_tail(path: str, limit: int = 60) -> str:
    """A path for a narrow column, shortened from the left: `…/checkout/train.py` keeps the directories
    nearest the file that fit in `limit` characters and always the file name, which (with its line) is what
    a reader looks for; the head of a deep path tells them nothing. Short paths are returned as they are."""
    if len(path) <= limit:
        return path
    parts = path.replace(os.sep, "/").split("/")
    kept = [parts[-1]]
    for part in reversed(parts[:-1]):
        if len("…/") + len(part) + 1 + len("/".join(kept)) > limit:
            break
        kept.insert(0, part)
    return "…/" + "/".join(kept)
