"""Which tests must share a lane (an xdist worker: scripts/test.sh runs the suite in parallel lanes).

A module- or session-scoped fixture of ours (a real job whose run several tests read: the demo, a guarded
job) is made once per lane that asks for it; tests that read the same one are put in one xdist group, so
that the job runs once. The session-scoped fixtures are one group together (the examples' runs read the
demo's through `request.getfixturevalue`, which no test names); a module-scoped fixture's readers are a group
of their own, joined to the session group when one of them also reads a session fixture. A test already
marked `xdist_group` keeps its mark."""

from __future__ import annotations

import pytest

SESSION_GROUP = "session-fixtures"
_SHARED_SCOPES = ("module", "package", "session")


def _shared_fixtures(item: pytest.Item) -> set[str]:
    """Keys of the shared fixtures of ours the test uses (a plugin's fixtures have no baseid)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    keys = set()
    for name, definitions in info.name2fixturedefs.items():
        for definition in definitions:
            if definition.baseid and definition.scope in _SHARED_SCOPES:
                module = item.nodeid.split("::")[0]
                keys.add(SESSION_GROUP if definition.scope == "session" else f"{module}::{name}")
    return keys


def group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    def join(a: str, b: str) -> None:
        a, b = root(a), root(b)
        if a != b:  # the session group stays the name of any group it joins
            parent[b if a == SESSION_GROUP else a] = a if a == SESSION_GROUP else b

    uses = {item.nodeid: sorted(_shared_fixtures(item)) for item in items}
    for keys in uses.values():
        for key in keys[1:]:
            join(keys[0], key)
    for item in items:
        keys = uses[item.nodeid]
        if keys and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(root(keys[0])))


def name_the_groups_in_node_ids(items: list[pytest.Item]) -> None:
    """What `--dist loadgroup` does in the worker, done so that it takes effect: xdist's scheduler reads a
    test's group from the end of its node id (`path::test[param]@group`), and xdist 3.8 writes it to
    `item._nodeid`, which pytest 9.2 no longer reads (the node id is `item._id`, a NodeId): every test was
    scheduled on its own, a module or session job ran once per lane that met one of its readers, and the
    example tests, waiting on the demo in a lane of their own, hit their 120 s timeout and made every run
    again (pytest-xdist issue 1386). Several groups are joined as xdist joins them (sorted, '_')."""
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid.rpartition("]")[2]:
            continue  # no group, or the id already carries one (an xdist that sets it itself)
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")
