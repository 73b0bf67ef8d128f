"""The one place a command gets its rich `Console`, so that every report reads the same in a terminal, a
file, a pipe and a CI log.

rich takes 80 columns for anything that is not a terminal, and cuts a table cell that does not fit with an
ellipsis: `ddpdoctor rules | grep` then found `backend-device-misma…`, and a guard report in a CI log lost the
end of each rank's `path:line`. The width here is `COLUMNS` when it is set (as rich, ruff and click read it),
the terminal's own width on a terminal, and otherwise `PIPE_WIDTH`: wide enough for a table of slugs, codes
and `path:line`s to stay on one line each. Cells that must never be cut (slugs, codes, `path:line`) are
given `no_wrap=True, overflow="fold"` where their table is built, so at worst they break, never lose text.
"""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 200  # no terminal and no COLUMNS: a file, a pipe, a CI log (which wrap, or scroll, themselves)


def output_width(stream: IO[str] | None) -> int:
    """The width to render at for `stream`. A terminal is measured here, on the stream's own descriptor:
    rich measures whichever standard stream is a terminal, which is not this one when stdout is piped and
    stderr is not."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream is not None and stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or PIPE_WIDTH
    except (AttributeError, ValueError, OSError):  # closed, or not a real file
        pass
    return PIPE_WIDTH


def make_console(*, stderr: bool = False, file: IO[str] | None = None, **options: Any) -> Console:
    """A Console on stdout (or stderr, or `file`) at `output_width`, without rich's guessing highlighter
    (it colours numbers and paths of the user's text as if it knew what they were)."""
    from rich.console import Console

    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    options.setdefault("highlight", False)
    return Console(file=file, stderr=stderr, width=output_width(stream), **options)
