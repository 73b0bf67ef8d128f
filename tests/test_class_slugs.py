"""Every failure class the guard names is one the catalogue knows, with the advice its verdicts look up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ddpdoctor.audits
import ddpdoctor.guard
from ddpdoctor.advice import advice_table
from ddpdoctor.catalogue import CATALOGUE
from ddpdoctor.guard.judge.verdict import Decision

GUARD = Path(ddpdoctor.guard.__file__).parent
AUDITS = Path(ddpdoctor.audits.__file__).parent


def _strings(node: ast.AST, assigned: dict[str, list[ast.AST]], seen: set[str]) -> set[str]:
    """The string values an expression can take: constants, both sides of a conditional, and names
    followed to what the module assigns them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _strings(node.body, assigned, seen) | _strings(node.orelse, assigned, seen)
    if isinstance(node, ast.Name) and node.id not in seen:
        seen.add(node.id)
        return set().union(*(_strings(value, assigned, seen) for value in assigned.get(node.id, [])))
    return set()


def slugs_named_in(path: Path) -> set[str]:
    """The classes a module passes as `class_=` to a Finding (directly or through a name it assigns)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "class_":
            found |= _strings(node.value, assigned, set())
    return found


def test_every_class_the_guard_code_names_is_a_catalogue_slug() -> None:
    named = {
        slug: path.name
        for folder in (GUARD, AUDITS)
        for path in folder.rglob("*.py")
        for slug in slugs_named_in(path)
    }
    named.update({decision.class_: "verdict.py" for decision in Decision})
    assert len(named) >= 6  # the scan found the guard's classes (F1, F2, F3, F4, F6a, F6b, F7, F9)
    unknown = {slug: where for slug, where in named.items() if CATALOGUE.get(slug) is None}
    assert not unknown


@pytest.mark.parametrize("decision", list(Decision), ids=lambda d: d.value)
def test_every_decision_has_the_advice_of_its_class(decision: Decision) -> None:
    assert advice_table(decision.class_).get("default")


def test_the_precise_advice_a_verdict_names_is_in_its_class() -> None:
    assert (
        "torch.distributed.algorithms.Join([model])" in advice_table("collective-divergence")["uneven-steps"]
    )
    dead = advice_table("dead-rank")
    assert {"killed", "crashed", "bus"} <= set(dead)
    assert "Out of memory: Killed process" in dead["killed"] and "/dev/shm" in dead["bus"]
