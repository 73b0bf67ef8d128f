"""`explain`'s knowledge base: the signatures, extractors and refinements in the catalogue data files.

Each catalogue file (`catalogue/data/<id>-<slug>.toml`) may carry, besides its documentation fields:

- `[[signatures]]`: a regex that, found in a log line, points at the class (`id`, `pattern`, `confidence`,
  `role` = "root" | "victim", optional `requires` regex over the rank's surrounding lines, `fix` and
  `explain` templates filled with the facts);
- `[[extractors]]`: a regex with named groups run over a hit's context to establish facts (`scope` =
  "line" | "before" | "after" | "fact:<name>");
- `[[refinements]]`: a regex (`when`) that, found in the hit's context (`scope = "context"`) or anywhere in
  the log (`scope = "log"`), adds facts, confidence and a more specific fix and explanation.

docs/explain.md documents the format. A malformed entry is a bug in the package: loading raises
`KnowledgeError` naming the file and the entry, never skips it.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..catalogue import CATALOGUE, FailureClass
from .trigger import MIN_ANCHOR, Trigger, anchors

ROLES = ("root", "victim")
EXTRACTOR_SCOPES = ("line", "before", "after", "context")
REFINEMENT_SCOPES = ("context", "log")
_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>")
_FACT_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class KnowledgeError(ValueError):
    """A signature, extractor or refinement in a catalogue file is malformed."""


@dataclass(frozen=True)
class Signature:
    id: str
    slug: str
    pattern: re.Pattern[str]
    confidence: float
    role: str = "root"
    requires: re.Pattern[str] | None = None
    # alternatives, most specific first: the first whose facts are all known is used
    fix: tuple[str, ...] = ()
    # sentences, each given as alternatives like `fix`
    explain: tuple[tuple[str, ...], ...] = ()
    fallback: bool = False  # counts only on lines that no other signature explains
    with_victims: bool = False  # counts only when another rank reported a victim message
    final: bool = False  # counts only if its rank printed nothing but traceback lines after it


@dataclass(frozen=True)
class Extractor:
    fact: str
    pattern: re.Pattern[str]
    scope: str = "before"  # or "line", "after", "context", "fact:<name>"


@dataclass(frozen=True)
class Refinement:
    id: str
    when: re.Pattern[str]
    scope: str = "context"
    facts: Mapping[str, Any] = field(default_factory=dict)
    confidence: float = 0.0
    fix: tuple[str, ...] = ()
    explain: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class ClassKnowledge:
    failure: FailureClass
    signatures: tuple[Signature, ...]
    extractors: tuple[Extractor, ...]
    refinements: tuple[Refinement, ...]


@dataclass(frozen=True)
class KnowledgeBase:
    classes: tuple[ClassKnowledge, ...]
    # Every signature and log-scope refinement: the only search run over every byte of a log.
    trigger: Trigger

    @property
    def signatures(self) -> tuple[Signature, ...]:
        return tuple(sig for cls in self.classes for sig in cls.signatures)

    @property
    def log_refinements(self) -> tuple[tuple[str, Refinement], ...]:
        return tuple(
            (cls.failure.slug, ref) for cls in self.classes for ref in cls.refinements if ref.scope == "log"
        )

    def for_slug(self, slug: str) -> ClassKnowledge:
        for cls in self.classes:
            if cls.failure.slug == slug:
                return cls
        raise KeyError(slug)

    def looked_for(self) -> list[str]:
        """One line per class that has signatures: what `explain` searched the log for."""
        return [
            f"{cls.failure.slug}: " + "; ".join(
                dict.fromkeys(_describe(sig.pattern.pattern) for sig in cls.signatures if not sig.fallback)
            )
            for cls in self.classes
            if any(not sig.fallback for sig in cls.signatures)
        ]


_UNESCAPE = (
    (r"\x27", "'"),
    (r"\s*", " "),
    (r"\s+", " "),
    (r"\d+", "N"),
    (r"\w+", "X"),
    ("(?:", "("),
    ("?", ""),
)


def _describe(pattern: str) -> str:
    """A regex made readable for "looked for ...": named groups become <name>, escapes are undone,
    lookarounds dropped, `(a|b)` shown as a/b and wildcards as an ellipsis."""
    pattern = pattern.replace("\\(", "\x00").replace("\\)", "\x01")  # literal parentheses stay
    pattern = re.sub(r"\(\?<?[!=][^()]*\)", "", pattern)
    pattern = re.sub(r"\.[*+]\??|\.\{[\d,]+\}\??", "…", pattern)
    out = []
    i = 0
    while i < len(pattern):
        match = _NAMED_GROUP.match(pattern, i)
        if match:
            depth, j = 1, match.end()
            while j < len(pattern) and depth:
                if pattern[j] == "\\":
                    j += 1
                elif pattern[j] == "(":
                    depth += 1
                elif pattern[j] == ")":
                    depth -= 1
                j += 1
            out.append(f"<{match.group(1)}>")
            i = j
            continue
        out.append(pattern[i])
        i += 1
    text = "".join(out)
    for old, new in _UNESCAPE:
        text = text.replace(old, new)
    text = re.sub(r"\\(.)", r"\1", text)
    while True:  # innermost groups first: (a|b) -> a/b, (optional part) -> optional part
        simpler = re.sub(r"\(([^()]*)\)", lambda m: m.group(1).replace("|", "/"), text)
        if simpler == text:
            break
        text = simpler
    text = text.replace("|", " or ").replace("\x00", "(").replace("\x01", ")")
    text = re.sub(r" +", " ", text)
    return text if len(text) <= 90 else text[:87] + "..."


def _compile(value: Any, where: str, name: str) -> re.Pattern[str]:
    if not isinstance(value, str) or not value:
        raise KnowledgeError(f"{where}: `{name}` must be a non-empty regex string")
    if "(?P=" in value:
        raise KnowledgeError(f"{where}: `{name}` may not use back-references")
    try:
        return re.compile(value)
    except re.error as exc:
        raise KnowledgeError(f"{where}: `{name}` is not a valid regex: {exc}") from exc


def _anchored(pattern: re.Pattern[str], where: str, name: str) -> re.Pattern[str]:
    if anchors(pattern.pattern) is None:
        raise KnowledgeError(
            f"{where}: `{name}` must start with at least {MIN_ANCHOR} literal characters (in each top-level "
            "alternative), so that logs can be searched at full speed"
        )
    return pattern


def _confidence(value: Any, where: str, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= 1:
        raise KnowledgeError(f"{where}: `confidence` must be a number between {low} and 1")
    return float(value)


def _templates(value: Any, where: str, name: str) -> tuple[str, ...]:
    """A template or a list of them; placeholders are fact names (`{seq_num}`), `{{` is a literal brace."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise KnowledgeError(f"{where}: `{name}` must be a string or a list of strings")
    for item in items:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(item) if f is not None]
        except ValueError as exc:
            raise KnowledgeError(f"{where}: `{name}` is not a valid template: {exc}") from exc
        for f in fields:
            if not _FACT_NAME.match(f):
                raise KnowledgeError(f"{where}: `{name}` placeholder {{{f}}} is not a plain fact name")
    return tuple(item for item in items if item)


def _sentences(value: Any, where: str) -> tuple[tuple[str, ...], ...]:
    """`explain`: a sentence, or a list whose items are sentences or lists of alternatives for one."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise KnowledgeError(f"{where}: `explain` must be a string or a list")
    out = []
    for item in items:
        alternatives = _templates(item, where, "explain")
        if alternatives:
            out.append(alternatives)
    return tuple(out)


def _table_list(data: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise KnowledgeError(f"{where}: `{key}` must be an array of tables ([[{key}]])")
    return value


def _check_keys(entry: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(entry) - allowed
    if unknown:
        raise KnowledgeError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")


def parse_class_knowledge(failure: FailureClass) -> ClassKnowledge:
    """Validate and compile one class's `explain` tables (found in `FailureClass.extra`)."""
    source = failure.source or failure.slug
    extra = failure.extra
    signatures = []
    seen: set[str] = set()
    for i, entry in enumerate(_table_list(extra, "signatures", source)):
        where = f"{source}: signatures[{i}]"
        _check_keys(
            entry,
            {
                *("id", "pattern", "confidence", "role", "requires", "fix", "explain"),
                *("fallback", "with_victims", "final"),
            },
            where,
        )
        for flag in ("fallback", "with_victims", "final"):
            if not isinstance(entry.get(flag, False), bool):
                raise KnowledgeError(f"{where}: `{flag}` must be true or false")
        sig_id = entry.get("id")
        if not isinstance(sig_id, str) or not sig_id:
            raise KnowledgeError(f"{where}: `id` must be a non-empty string")
        if sig_id in seen:
            raise KnowledgeError(f"{where}: duplicate id {sig_id!r}")
        seen.add(sig_id)
        role = entry.get("role", "root")
        if role not in ROLES:
            raise KnowledgeError(f"{where}: `role` must be one of {', '.join(ROLES)}")
        if "confidence" not in entry:
            raise KnowledgeError(f"{where}: `confidence` is required")
        signatures.append(
            Signature(
                id=sig_id,
                slug=failure.slug,
                pattern=_anchored(_compile(entry.get("pattern"), where, "pattern"), where, "pattern"),
                confidence=_confidence(entry["confidence"], where, 0.0),
                role=role,
                requires=_compile(entry["requires"], where, "requires") if "requires" in entry else None,
                fix=_templates(entry.get("fix", []), where, "fix"),
                explain=_sentences(entry.get("explain", []), where),
                fallback=entry.get("fallback", False),
                with_victims=entry.get("with_victims", False),
                final=entry.get("final", False),
            )
        )
    extractors = []
    for i, entry in enumerate(_table_list(extra, "extractors", source)):
        where = f"{source}: extractors[{i}]"
        _check_keys(entry, {"fact", "pattern", "scope"}, where)
        scope = entry.get("scope", "before")
        if not isinstance(scope, str) or not (scope in EXTRACTOR_SCOPES or scope.startswith("fact:")):
            raise KnowledgeError(
                f"{where}: `scope` must be one of {', '.join(EXTRACTOR_SCOPES)} or fact:<name>"
            )
        pattern = _compile(entry.get("pattern"), where, "pattern")
        fact = entry.get("fact", "")
        if not isinstance(fact, str) or (fact and not _FACT_NAME.match(fact)):
            raise KnowledgeError(f"{where}: `fact` must be a lower_case name")
        if not fact and not pattern.groupindex:
            raise KnowledgeError(f"{where}: give `fact` or named groups in `pattern`")
        extractors.append(Extractor(fact=fact, pattern=pattern, scope=scope))
    refinements = []
    for i, entry in enumerate(_table_list(extra, "refinements", source)):
        where = f"{source}: refinements[{i}]"
        _check_keys(entry, {"id", "when", "scope", "facts", "confidence", "fix", "explain"}, where)
        ref_id = entry.get("id")
        if not isinstance(ref_id, str) or not ref_id:
            raise KnowledgeError(f"{where}: `id` must be a non-empty string")
        scope = entry.get("scope", "context")
        if scope not in REFINEMENT_SCOPES:
            raise KnowledgeError(f"{where}: `scope` must be one of {', '.join(REFINEMENT_SCOPES)}")
        facts = entry.get("facts", {})
        if not isinstance(facts, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in facts.items()
        ):
            raise KnowledgeError(f"{where}: `facts` must be a table of plain values")
        when = _compile(entry.get("when"), where, "when")
        if scope == "log":
            _anchored(when, where, "when")
        refinements.append(
            Refinement(
                id=ref_id,
                when=when,
                scope=scope,
                facts=dict(facts),
                confidence=_confidence(entry.get("confidence", 0.0), where, -1.0),
                fix=_templates(entry.get("fix", []), where, "fix"),
                explain=_sentences(entry.get("explain", []), where),
            )
        )
    return ClassKnowledge(failure, tuple(signatures), tuple(extractors), tuple(refinements))


def load_knowledge(classes: Iterable[FailureClass] | None = None) -> KnowledgeBase:
    parsed = tuple(parse_class_knowledge(c) for c in (CATALOGUE if classes is None else classes))
    patterns: list[re.Pattern[str]] = [s.pattern for c in parsed for s in c.signatures]
    patterns += [r.when for c in parsed for r in c.refinements if r.scope == "log"]
    return KnowledgeBase(classes=parsed, trigger=Trigger(patterns))


_CACHED: KnowledgeBase | None = None


def knowledge_base() -> KnowledgeBase:
    """The packaged knowledge base, parsed once."""
    global _CACHED
    if _CACHED is None:
        _CACHED = load_knowledge()
    return _CACHED
