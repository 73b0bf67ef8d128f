"""One line the scanner found, read in its context: the rank's own lines before and after it (ranks glued
into one line or interleaved are separated), the facts the class's extractors and the traceback give, and
the score its refinements add."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..crash_dump import parse_dumps
from .knowledge import ClassKnowledge, Signature
from .lines import clean, mentioned_rank, rank_segments
from .outcome import SignatureHit
from .scanner import RawHit

# Generic traceback structure, true of every class: the innermost frame the user wrote and the exception.
_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]bin[/\\]|<frozen")
_USER_FRAME = re.compile(
    r'File "(?P<user_file>(?![^"]*(?:' + _LIBRARY_PATH.pattern + r'))[^"]+)", '
    r"line (?P<user_line>\d+), in (?P<user_function>[\w<>.]+)"
)
# rich's boxed tracebacks (Lightning, typer): "│ /path/to/fi │" + "│ le.py:12 in f │" is one frame.
_RICH_FRAME = re.compile(
    r"^\s*(?P<user_file>(?![^\s]*(?:site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]bin[/\\]))[^\s\"]+\.py)"
    r":(?P<user_line>\d+) in (?P<user_function>[\w<>.]+)"
)
_BOXED = re.compile(r"^[│┃] ?(?P<content>.*?)\s*[│┃]\s*$")
_EXCEPTION = re.compile(r"(?:^|\s)(?P<exception>(?:[\w.]+\.)?\w*(?:Error|Exception|Warning))\s*:")
_TRACEBACK_START = "Traceback (most recent call last)"
_FATAL_ERROR = "Fatal Python error: "  # faulthandler's dump of a crashing process follows
# What may follow a fatal exception on its rank: more traceback (a chain), nothing else.
TRACEBACK_LINE = re.compile(
    r"^(?:\s|$|Traceback|During handling|The above exception|[\w.]*(?:Error|Exception|Interrupt)\b)"
)


def _unbox(lines: list[str]) -> list[str]:
    """Lines of a rich traceback without the box, with paths that rich wrapped at the box edge rejoined."""
    if not any("│" in line or "┃" in line for line in lines):
        return lines
    out: list[str] = []
    joining = False
    for line in lines:
        boxed = _BOXED.match(line)
        if not boxed:
            out.append(line)
            joining = False
            continue
        content = boxed.group("content")
        if joining and out and content and not content.startswith(" "):
            out[-1] += content.strip()
        else:
            out.append(content)
        # a path cut at the box edge continues on the next line
        joining = bool(re.search(r"[/\\]\S*$", content)) and " in " not in content
    return out


def rank_context(hit: RawHit) -> tuple[int | None, str, list[str], list[str]]:
    """The hit's rank and text, and the lines of the same rank before and after it."""
    prefix_rank, text = clean(hit.raw)
    before = []
    for raw in hit.before:
        for segment in rank_segments(raw):  # ranks glued into one line are lines of their own
            rank, line = clean(segment)
            if rank == prefix_rank:
                before.append(line)
    after = []
    for raw in hit.after:
        for segment in rank_segments(raw):
            rank, line = clean(segment)
            if rank == prefix_rank:
                after.append(line)
    rank = prefix_rank if prefix_rank is not None else mentioned_rank(text)
    return rank, text, _unbox(before), _unbox(after)


def extract(
    knowledge: ClassKnowledge, text: str, before: list[str], after: list[str], facts: dict[str, Any]
) -> None:
    def search_lines(pattern: re.Pattern[str], lines: Iterable[str]) -> re.Match[str] | None:
        for line in lines:
            found = pattern.search(line)
            if found:
                return found
        return None

    for extractor in knowledge.extractors:
        scope = extractor.scope
        if scope == "line":
            found = extractor.pattern.search(text)
        elif scope == "before":
            found = search_lines(extractor.pattern, reversed(before))
        elif scope == "after":
            found = search_lines(extractor.pattern, after)
        elif scope == "context":
            found = search_lines(extractor.pattern, [*reversed(before), *after])
        else:  # fact:<name>
            source_fact = facts.get(scope[5:])
            found = extractor.pattern.search(str(source_fact)) if source_fact is not None else None
        if not found:
            continue
        groups = {k: v for k, v in found.groupdict().items() if v is not None}
        if extractor.fact and extractor.fact not in facts:
            facts[extractor.fact] = groups.pop(extractor.fact, None) or found.group(0).strip()
        for key, value in groups.items():
            facts.setdefault(key, value)


def _crash_facts(lines: list[str], facts: dict[str, Any]) -> None:
    """`crash_signal`, `crash_frame` and `crash_function` from faulthandler's dump of a crashed rank
    (`PYTHONFAULTHANDLER=1`): the innermost frame the user wrote in the crashing thread's stack, which is
    then also the `user_frame` (the finding's location). The dump of the signal the launcher names, if
    several."""
    dumps = parse_dumps(lines)
    named = [d for d in dumps if d.signal == facts.get("dead_signal")]
    if not (named or dumps):
        return
    dump = (named or dumps)[-1]
    facts.setdefault("crash_signal", dump.signal)
    for path, line, function in dump.stack():
        if not _LIBRARY_PATH.search(path):
            facts.setdefault("crash_frame", f"{path}:{line}")
            facts.setdefault("crash_function", function)
            facts.setdefault("user_frame", f"{path}:{line}")
            facts.setdefault("user_function", function)
            return


def _current_traceback(before: list[str]) -> list[str]:
    """The lines of the traceback that ends at the hit (back to its `Traceback (most recent ...)` line)."""
    for i in range(len(before) - 1, -1, -1):
        if _TRACEBACK_START in before[i]:
            return before[i:]
    return before


def coerce(value: Any) -> Any:
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,18}", value):
        return int(value)
    return value


def signature_hit(
    knowledge: ClassKnowledge,
    signature: Signature,
    found: re.Match[str],
    hit: RawHit,
    rank: int | None,
    text: str,
    before: list[str],
    after: list[str],
    context_text: str,
) -> SignatureHit:
    """Facts, rank and score of one signature found on one line."""
    facts: dict[str, Any] = {k: v for k, v in found.groupdict().items() if v is not None}
    extract(knowledge, text, before, after, facts)
    if signature.role == "root":
        frame = None
        for line in reversed(_current_traceback(before)):
            frame = _USER_FRAME.search(line) or _RICH_FRAME.search(line)
            if frame:
                break
        if frame:
            facts.setdefault("user_frame", f"{frame['user_file']}:{frame['user_line']}")
            facts.setdefault("user_function", frame["user_function"])
        if _FATAL_ERROR in context_text:
            _crash_facts([*before, text, *after], facts)
    exception = _EXCEPTION.search(text)
    if exception:
        facts.setdefault("exception", exception.group("exception").rsplit(".", 1)[-1])
    if "rank" in facts:  # an extractor named the rank (torchrun's summary, a launcher's command line)
        named = coerce(facts.pop("rank"))
        rank = named if isinstance(named, int) else rank
    score = signature.confidence
    applied = []
    for refinement in knowledge.refinements:
        if refinement.scope != "context":
            continue
        ref_found = refinement.when.search(context_text)
        if ref_found:
            applied.append(refinement)
            score += refinement.confidence
            facts.update(refinement.facts)
            for key, value in ref_found.groupdict().items():
                if value is not None:
                    facts.setdefault(key, value)
    return SignatureHit(
        signature, hit, rank, text, {k: coerce(v) for k, v in facts.items()}, score, applied, order=0
    )
