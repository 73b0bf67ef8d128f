"""`[tool.ddpdoctor]` in pyproject.toml, merged with the command line, and rule selection (ruff's rules).

```toml
[tool.ddpdoctor]
select = ["DDP"]                 # codes or prefixes; default: every rule
ignore = ["DDP103"]
extend-select = []
exclude = ["legacy/", "*_pb2.py"]  # globs, relative to the directory of pyproject.toml
per-file-ignores = { "tests/*" = ["DDP601"] }
```

Selection: a rule is on when the most specific `select` prefix that matches it is more specific than the
most specific `ignore` prefix that matches it (`--select DDP --ignore DDP1` turns DDP1xx off;
`--select DDP101 --ignore DDP1` keeps DDP101).
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KNOWN_KEYS = {"select", "ignore", "extend-select", "exclude", "extend-exclude", "per-file-ignores"}


@dataclass
class Settings:
    root: Path  # the directory globs are relative to (pyproject.toml's, else the working directory)
    select: list[str] = field(default_factory=lambda: ["DDP"])
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    config_path: Path | None = None

    def enabled(self, codes: Iterable[str]) -> set[str]:
        selected = [*self.select, *self.extend_select]
        for prefix in [*selected, *self.ignore]:
            _check_prefix(prefix, codes)
        return {code for code in codes if _decide(code, selected, self.ignore)}

    def ignored_for(self, path: str) -> list[str]:
        rel = self.relative(path)
        found: list[str] = []
        for pattern, codes in self.per_file_ignores.items():
            if _matches(rel, pattern):
                found.extend(codes)
        return found

    def excluded(self, path: str) -> bool:
        rel = self.relative(path)
        return any(_matches(rel, pattern) for pattern in self.exclude)

    def relative(self, path: str) -> str:
        absolute = os.path.abspath(path)
        try:
            return Path(absolute).relative_to(self.root).as_posix()
        except ValueError:
            return Path(absolute).as_posix()


def _check_prefix(prefix: str, codes: Iterable[str]) -> None:
    if prefix.upper() == "ALL":
        return
    if not any(code.startswith(prefix.upper()) for code in codes):
        raise UsageError(f"unknown rule code or prefix {prefix!r} (see `ddpdoctor rules`)")


def _specificity(code: str, prefixes: Sequence[str]) -> int:
    best = -1
    for prefix in prefixes:
        p = prefix.upper()
        if p == "ALL":
            best = max(best, 0)
        elif code.startswith(p):
            best = max(best, len(p))
    return best


def _decide(code: str, selected: Sequence[str], ignored: Sequence[str]) -> bool:
    chosen = _specificity(code, selected)
    return chosen >= 0 and chosen > _specificity(code, ignored)


def _matches(rel: str, pattern: str) -> bool:
    pattern = pattern.strip()
    if pattern.endswith("/"):
        pattern += "*"
    if fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(rel, pattern + "/*"):
        return True
    if "/" not in pattern.rstrip("*"):  # a bare name matches at any depth (`*_pb2.py`, `legacy`)
        parts = rel.split("/")
        return any(fnmatch.fnmatchcase(part, pattern) for part in parts)
    return False


def find_pyproject(start: Path) -> Path | None:
    for directory in [start, *start.parents]:
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise UsageError(f"cannot read {candidate}: {exc}") from None
            if "ddpdoctor" in data.get("tool", {}):
                return candidate
    return None


def load(config: str | None = None, isolated: bool = False, cwd: Path | None = None) -> Settings:
    cwd = cwd or Path.cwd()
    if isolated:
        return Settings(root=cwd)
    path = Path(config) if config else find_pyproject(cwd)
    if path is None:
        return Settings(root=cwd)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    table: dict[str, Any] = (
        data.get("tool", {}).get("ddpdoctor", {}) if path.name == "pyproject.toml" else data
    )
    unknown = set(table) - KNOWN_KEYS
    if unknown:
        raise UsageError(f"{path}: unknown key(s) in [tool.ddpdoctor]: {', '.join(sorted(unknown))}")
    settings = Settings(root=path.resolve().parent, config_path=path)
    for key in ("select", "ignore", "extend-select", "exclude", "extend-exclude"):
        if key in table and not (
            isinstance(table[key], list) and all(isinstance(v, str) for v in table[key])
        ):
            raise UsageError(f"{path}: [tool.ddpdoctor] {key} must be a list of strings")
    settings.select = list(table.get("select", settings.select))
    settings.ignore = list(table.get("ignore", []))
    settings.extend_select = list(table.get("extend-select", []))
    settings.exclude = [*table.get("exclude", []), *table.get("extend-exclude", [])]
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict) or not all(
        isinstance(v, list) and all(isinstance(c, str) for c in v) for v in pfi.values()
    ):
        raise UsageError(f"{path}: [tool.ddpdoctor] per-file-ignores must map globs to lists of codes")
    settings.per_file_ignores = {str(k): list(v) for k, v in pfi.items()}
    return settings
