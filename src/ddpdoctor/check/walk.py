"""The one walk the call-graph queries share: from a node, along edges (a function's calls, or its callers),
to the first node that answers, memoised, iterative and cycle-safe.

"Does `train()` reach a `torch.save`?" walks callees; "does `train()` run on every rank?" walks callers. Both
are the same depth-first search: a node either answers itself (a save, module-level code) or hands over its
edges; the first edge whose node has an answer gives this node its answer, built from the edge and the
inner answer (a chain of calls one step longer). A node being explored sits in the memo as None, so a cycle
ends where it closes: it can only hide an answer, never invent one. A 10,000-deep chain costs its length and
no recursion.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)
Edge = TypeVar("Edge")
Answer = TypeVar("Answer")


def first_answer(
    start: Node,
    memo: dict[Node, Answer | None],
    visit: Callable[[Node], tuple[Answer | None, Sequence[Edge]]],
    across: Callable[[Edge], Node],
    extend: Callable[[Node, Edge, Answer], Answer],
) -> Answer | None:
    """`visit(node)` gives the node's own answer (or None) and the edges to follow when it has none;
    `across(edge)` the node an edge leads to; `extend(node, edge, inner)` the node's answer through an edge
    whose node answered `inner`."""
    if start in memo:
        return memo[start]
    frames: list[tuple[Node, Sequence[Edge], int]] = []

    def enter(node: Node) -> None:
        memo[node] = None
        own, edges = visit(node)
        if own is not None:
            memo[node] = own
        elif edges:
            frames.append((node, edges, 0))

    enter(start)
    while frames:
        node, edges, i = frames[-1]
        if i >= len(edges):
            frames.pop()
            continue
        child = across(edges[i])
        if child not in memo:
            enter(child)
            continue
        inner = memo[child]
        if inner is not None:
            memo[node] = extend(node, edges[i], inner)
            frames.pop()
            continue
        frames[-1] = (node, edges, i + 1)
    return memo.get(start)


def same(_node: object, _edge: object, inner: bool) -> bool:
    """`extend` for a yes/no question: a node answers what the node its edge leads to answered."""
    return inner
