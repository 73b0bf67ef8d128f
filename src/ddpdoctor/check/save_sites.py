"""Is the save at the end of a cross-file chain still one that every caller's process runs, read with the
whole project known?

A function's summary (`FunctionSummary.save`) is made in the first pass, with its own file alone: a rank
test through another module's helper (`if mpu.get_data_parallel_rank() == 0:`, the helper returning its
group's rank) is no rank test there, so the save looks unguarded, and every cross-file caller of the
function would be reported with a chain ending at it. Before a caller's finding is made of that chain, the
save's file is read again with the index (once per file and process, only when a chain is about to be
reported), and the save is judged as DDP601 judges it in its own file: under a one-writer rank test, under
a test that may be one (`if dp_rank == 0:` on a name of unknown origin), or to a path that holds a rank, it
is no evidence.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .every_rank import EveryRank
from .facts import Step
from .guards import GuardedCall, RankFlow
from .rank_paths import holds_rank
from .source import SourceFile
from .writes import checkpoint_write, destination, shared_destination

if TYPE_CHECKING:
    from .project import ProjectIndex


class _Read:
    """One file read again with the index: its calls with their guards, and the maybe-rank tests."""

    def __init__(self, source: SourceFile):
        self.source = source
        flow = RankFlow(source, lambda branch, cls: False, skip_unranked=False)
        self.calls = flow.calls
        self.maybe_guarded = EveryRank(source, flow.calls).maybe_guarded


def shared_save(project: ProjectIndex, step: Step) -> bool:
    """The write summarised at `step` (a chain's last link) writes a shared path outside any rank test that
    lets one process per node through, as far as the whole project shows. A file that cannot be read again
    keeps the summary's word."""
    read = _read(project, step.path)
    if read is None:
        return True
    here = [g for g in read.calls if g.call.lineno == step.line
            and checkpoint_write(read.source, g.call) is not None]
    return not here or any(_shared(read, g) for g in here)


def _shared(read: _Read, guarded: GuardedCall) -> bool:
    guard, call, source = guarded.guard, guarded.call, read.source
    if guard is not None and guard.one_writer_per_node or guard is None and id(call) in read.maybe_guarded:
        return False
    written = checkpoint_write(source, call)
    path = written[1] if written is not None else None
    path = destination(source, call, path) if path is not None else None
    return path is not None and shared_destination(source, path) and not holds_rank(source, path)


def _read(project: ProjectIndex, path: str) -> _Read | None:
    cache: dict[str, _Read | None] = project.__dict__.setdefault("_reread_saves", {})
    if path not in cache:
        cache[path] = None
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            cache[path] = _Read(SourceFile(path, text, ast.parse(text), project))
        except (OSError, SyntaxError, ValueError, RecursionError):
            pass
    return cache[path]
