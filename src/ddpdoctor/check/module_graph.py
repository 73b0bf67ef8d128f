"""The run's modules as a graph of imports: which files make one program (`component`), and which import a
file at any depth (`importers`). The call graph (`callgraph.py`) is built on it."""

from __future__ import annotations

from .facts import ModuleSummary


class ModuleGraph:
    """Needs `modules` (path -> summary) and the caches `_components`, `_members`, `_importers`, which the
    call graph's constructor makes."""

    modules: dict[str, ModuleSummary]
    _components: dict[str, int] | None
    _members: dict[int, list[ModuleSummary]]
    _importers: dict[str, set[str]] | None

    def component(self, path: str) -> list[ModuleSummary]:
        """The modules connected to `path` by project imports (either way): one program, as far as the
        checker can tell. A tree of independent scripts is many programs."""
        if self._components is None:
            self._components = self._connect()
            # each component's modules listed once, in the run's order: rules ask per file
            self._members = {}
            for p, m in self.modules.items():
                self._members.setdefault(self._components[p], []).append(m)
        key = self._components.get(path)
        if key is None:
            return [self.modules[path]] if path in self.modules else []
        return list(self._members[key])

    def importers(self, path: str) -> set[str]:
        """The modules that import `path`, at any depth: the programs it is a part of (two scripts that
        share a helper module are not each other's importers)."""
        if self._importers is None:
            self._importers = {}
            for module in self.modules.values():
                for other in module.imports:
                    self._importers.setdefault(other, set()).add(module.path)
        importers = self._importers
        frontier = [path]
        seen = {path}
        while frontier:
            frontier = [q for p in frontier for q in importers.get(p, ()) if q not in seen]
            seen.update(frontier)
        return seen - {path}

    def _connect(self) -> dict[str, int]:
        parent: dict[str, str] = {p: p for p in self.modules}

        def find(p: str) -> str:
            while parent[p] != p:
                parent[p] = parent[parent[p]]
                p = parent[p]
            return p

        for path, module in self.modules.items():
            for other in module.imports:
                if other in parent:
                    a, b = find(path), find(other)
                    if a != b:
                        parent[a] = b
        roots: dict[str, int] = {}
        return {p: roots.setdefault(find(p), len(roots)) for p in self.modules}
