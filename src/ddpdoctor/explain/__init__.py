"""`ddpdoctor explain`: read (multi-rank) training logs and name the failure, the culprit rank and the fix.

Pipeline: `source` (open, decode, refuse binaries) -> `wrapping` (rejoin wrapped lines) -> `scanner` with
`trigger` (stream blocks, find the lines the knowledge base cares about, with bounded context) -> `lines`
(rank prefixes, colours, glued ranks) and `launcher` (torchrun's summary) -> `context` and `analysis`
(signatures, facts, refinements, root vs victims) -> `diagnose` with `errors`, `order` and `slowrank` (the
first failure, the slow rank; one ranked list of `outcome` values) -> `render`.
The knowledge itself is data: `knowledge` loads it from the catalogue files.
A log with no failure message in it is read by `stopped`: a job that started and then stopped (killed by
`timeout`, a scheduler, SIGKILL) is a likely hang, with what each rank printed last (`stopped_text`).
No torch needed.
"""

from __future__ import annotations

from .diagnose import Diagnosis, Explanation, explain_logs
from .knowledge import KnowledgeBase, KnowledgeError, knowledge_base, load_knowledge
from .source import LogSource

__all__ = [
    "Diagnosis",
    "Explanation",
    "KnowledgeBase",
    "KnowledgeError",
    "LogSource",
    "explain_logs",
    "explain_paths",
    "knowledge_base",
    "load_knowledge",
]


def explain_paths(paths: list[str], kb: KnowledgeBase | None = None) -> Explanation:
    """Explain the logs at `paths` ("-" is stdin), read as one job's logs."""
    from .source import check_readable

    sources = [LogSource.from_arg(p) for p in paths]
    for source in sources:
        check_readable(source)
    return explain_logs(sources, kb or knowledge_base())
