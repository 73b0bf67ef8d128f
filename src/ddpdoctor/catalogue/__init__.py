"""The failure classes as data: one TOML file per class in `data/`, loaded and validated at import.

These files are the single source for `ddpdoctor rules`, the generated docs and `explain`'s knowledge
base. A malformed file is a bug in the package, so loading raises `CatalogueError` rather than skipping.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

REQUIRED_FIELDS = ("id", "slug", "title", "summary", "symptoms", "why", "fixes", "references", "rules")
_SLUG = re.compile(r"^[a-z][a-z0-9-]*$")
_ID = re.compile(r"^F\d+[a-z]?$")
_CODE = re.compile(r"^DDP\d{3}$")


class CatalogueError(ValueError):
    """A catalogue data file is missing a field, repeats a slug, or names something unknown."""


@dataclass(frozen=True)
class FailureClass:
    id: str
    slug: str
    title: str
    summary: str
    symptoms: tuple[str, ...]
    why: str
    fixes: tuple[str, ...]
    references: tuple[str, ...]
    rules: tuple[str, ...]
    reported_in: tuple[str, ...] = ()
    broken: str = ""
    fixed: str = ""
    # Everything else in the file (e.g. `explain`'s signatures), kept for the layers that own it.
    extra: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""


def _strings(value: Any, name: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CatalogueError(f"{where}: `{name}` must be a list of strings")
    return tuple(value)


def parse_class(data: Mapping[str, Any], source: str) -> FailureClass:
    """Validate one decoded data file and build its `FailureClass`."""
    missing = [name for name in REQUIRED_FIELDS if name not in data]
    if missing:
        raise CatalogueError(f"{source}: missing field(s) {', '.join(missing)}")
    for name in ("id", "slug", "title", "summary", "why"):
        if not isinstance(data[name], str) or not data[name].strip():
            raise CatalogueError(f"{source}: `{name}` must be a non-empty string")
    if not _SLUG.match(data["slug"]):
        raise CatalogueError(f"{source}: slug {data['slug']!r} is not lower-case-with-dashes")
    if not _ID.match(data["id"]):
        raise CatalogueError(f"{source}: id {data['id']!r} is not of the form F<n>[a-z]")
    rules = _strings(data["rules"], "rules", source)
    for code in rules:
        if not _CODE.match(code):
            raise CatalogueError(f"{source}: rule code {code!r} is not of the form DDPnnn")
    known = set(REQUIRED_FIELDS) | {"reported_in", "broken", "fixed"}
    return FailureClass(
        id=data["id"],
        slug=data["slug"],
        title=data["title"].strip(),
        summary=data["summary"].strip(),
        symptoms=_strings(data["symptoms"], "symptoms", source),
        why=data["why"].strip(),
        fixes=_strings(data["fixes"], "fixes", source),
        references=_strings(data["references"], "references", source),
        rules=rules,
        reported_in=_strings(data.get("reported_in", []), "reported_in", source),
        broken=str(data.get("broken", "")).strip("\n"),
        fixed=str(data.get("fixed", "")).strip("\n"),
        extra={k: v for k, v in data.items() if k not in known},
        source=source,
    )


class Catalogue:
    """All failure classes, indexed by slug, id and rule code."""

    def __init__(self, classes: list[FailureClass]):
        self._by_slug: dict[str, FailureClass] = {}
        self._by_id: dict[str, FailureClass] = {}
        self._by_code: dict[str, FailureClass] = {}
        for cls in classes:
            if cls.slug in self._by_slug:
                raise CatalogueError(f"{cls.source}: duplicate slug {cls.slug!r}")
            if cls.id in self._by_id:
                raise CatalogueError(f"{cls.source}: duplicate id {cls.id!r}")
            self._by_slug[cls.slug] = cls
            self._by_id[cls.id] = cls
            for code in cls.rules:
                if code in self._by_code:
                    raise CatalogueError(
                        f"{cls.source}: rule {code} already belongs to {self._by_code[code].slug}"
                    )
                self._by_code[code] = cls

    def __iter__(self) -> Iterator[FailureClass]:
        return iter(sorted(self._by_slug.values(), key=_id_order))

    def __len__(self) -> int:
        return len(self._by_slug)

    def __contains__(self, slug: object) -> bool:
        return slug in self._by_slug

    def get(self, slug: str) -> FailureClass:
        try:
            return self._by_slug[slug]
        except KeyError:
            raise KeyError(f"unknown failure class {slug!r}") from None

    def for_code(self, code: str) -> FailureClass | None:
        return self._by_code.get(code.upper())

    def lookup(self, key: str) -> list[FailureClass]:
        """Classes named by a slug, an id (`F4`; `F6` names both F6a and F6b) or a rule code."""
        key = key.strip()
        if key in self._by_slug:
            return [self._by_slug[key]]
        upper = key.upper()
        if upper in self._by_code:
            return [self._by_code[upper]]
        if key[:1].upper() == "F":
            norm = "F" + key[1:].lower()
            if norm in self._by_id:
                return [self._by_id[norm]]
            return [c for c in self if re.fullmatch(re.escape(norm) + r"[a-z]", c.id)]
        return []

    def check_rule_codes(self, rule_classes: Mapping[str, str]) -> None:
        """Cross-check the checker's registry (code -> class slug) against the data files."""
        for code, slug in rule_classes.items():
            if slug not in self._by_slug:
                raise CatalogueError(f"rule {code} points to unknown failure class {slug!r}")
            owner = self._by_code.get(code)
            if owner is None or owner.slug != slug:
                raise CatalogueError(f"rule {code} (class {slug}) is not listed in that class's `rules`")
        for code, cls in self._by_code.items():
            if code not in rule_classes:
                raise CatalogueError(f"{cls.source}: lists rule {code}, which the checker does not define")


def _id_order(cls: FailureClass) -> tuple[int, str]:
    digits = re.match(r"F(\d+)", cls.id)
    return (int(digits.group(1)) if digits else 999, cls.id)


def load_files(files: list[tuple[str, bytes]]) -> Catalogue:
    """Build a catalogue from (name, TOML bytes) pairs; used at import and by the tests."""
    classes = []
    for name, raw in files:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise CatalogueError(f"{name}: not valid TOML: {exc}") from exc
        classes.append(parse_class(data, name))
    return Catalogue(classes)


def _load_packaged() -> Catalogue:
    folder = resources.files(__name__).joinpath("data")
    files = sorted(
        (entry.name, entry.read_bytes()) for entry in folder.iterdir() if entry.name.endswith(".toml")
    )
    return load_files(files)


CATALOGUE = _load_packaged()
