"""Which tests must share a lane (an xdist worker: scripts/test.sh runs the suite in parallel lanes).

A module- or session-scoped fixture of ours (a real job whose run several tests read: the demo, a guarded
job) is made once per lane that asks for it; tests that read the same one are put in one xdist group, so
that the job runs once. A session-scoped fixture's readers all go into one group (they also share what
they start in the background, like the example runs); a module-scoped fixture's readers go into a group of
their module's, or into the session group when another test of the module is in it. A test already marked
`xdist_group` keeps its mark."""

from __future__ import annotations

import pytest

SESSION_GROUP = "session-fixtures"
_SHARED_SCOPES = ("module", "package", "session")


def _shared_scopes(item: pytest.Item) -> set[str]:
    """The scopes of the shared fixtures of ours the test uses (a plugin's fixtures have no baseid)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    scopes = set()
    for definitions in info.name2fixturedefs.values():
        for definition in definitions:
            if definition.baseid and definition.scope in _SHARED_SCOPES:
                scopes.add("session" if definition.scope == "session" else "module")
    return scopes


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    scopes = {item.nodeid: _shared_scopes(item) for item in items}
    with_session = {_module(item) for item in items if "session" in scopes[item.nodeid]}
    for item in items:
        if item.get_closest_marker("xdist_group") is not None or not scopes[item.nodeid]:
            continue
        module = _module(item)
        shared = "session" in scopes[item.nodeid] or module in with_session
        item.add_marker(pytest.mark.xdist_group(SESSION_GROUP if shared else module))
