"""Check one file: read it, parse it once, run the selected rules, drop what `# noqa` silences.

A file that cannot be checked is not a crash: it becomes one diagnostic, in ruff's spirit —
`E902` (cannot read: missing, unreadable, broken symlink, not UTF-8, too large) or `E999` (does not parse).
"""

from __future__ import annotations

import ast
import io
import os
import re
import stat
import sys
import tokenize
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..findings import Finding, Location, Severity
from .project import ModuleSummary, ProjectFiles, ProjectIndex, summarize
from .registry import Rule, all_rules
from .source import SourceFile

MAX_BYTES = 10 * 1024 * 1024  # larger "source" is generated data, not code anyone reviews
IO_ERROR = "E902"
SYNTAX_ERROR = "E999"
TOOL_CODES = (IO_ERROR, SYNTAX_ERROR)
INPUT_ERROR_CLASS = "input-error"

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]*(?:\s*,\s*[A-Za-z]+[0-9]*)*))?", re.IGNORECASE)


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    lines: int = 0
    text: str | None = None  # kept only when a fix may need it


class UnreadableFile(Exception):
    def __init__(self, reason: str, line: int | None = None, column: int | None = None):
        super().__init__(reason)
        self.line, self.column = line, column


def read_source(path: str) -> str:
    """The file's text, keeping its line endings; `UnreadableFile` with a one-line reason otherwise."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise UnreadableFile("is a directory")
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or never end
            raise UnreadableFile("not a regular file")
        size = info.st_size
        if size > MAX_BYTES:
            raise UnreadableFile(f"file too large to check ({size // (1024 * 1024)} MiB > "
                                 f"{MAX_BYTES // (1024 * 1024)} MiB)")
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        reason = "broken symbolic link" if os.path.islink(path) else "no such file"
        raise UnreadableFile(reason) from None
    except IsADirectoryError:
        raise UnreadableFile("is a directory") from None
    except OSError as exc:
        raise UnreadableFile(exc.strerror or str(exc)) from None
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is not part of the source
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # PEP 263: a coding cookie may name another encoding.
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError:
            encoding = "utf-8"
        if encoding.lower().replace("_", "-") not in ("utf-8", "utf-8-sig"):
            try:
                return data.decode(encoding)
            except (UnicodeDecodeError, LookupError):
                pass
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UnreadableFile(f"not valid UTF-8 (byte 0x{data[exc.start]:02x})", line, column) from None


def physical_lines(text: str) -> list[str]:
    """Lines as Python numbers them (`\\n`, `\\r\\n`, `\\r`), with their endings."""
    return io.StringIO(text, newline="").readlines()


def uses_project(rule: Rule | type[Rule]) -> bool:
    """Rules that follow calls into other functions and files (`project_wide = True` on the class)."""
    return bool(getattr(rule, "project_wide", False))


class Checker:
    """The selected rules, instantiated once per process and reused for every file.

    A whole run has two passes (runner.py): `first_pass` summarises the file for the project index and
    runs every rule with what the file alone shows; `second_pass` runs the rules that ask the index again,
    with the whole index, on the files where the other files matter. `check_text` checks one file with an
    index of that file alone (or the one given).
    """

    def __init__(self, codes: Iterable[str], project: ProjectIndex | None = None):
        registry = all_rules()
        self.rules: list[Rule] = [registry[code]() for code in sorted(codes) if code in registry]
        self.project = project

    def _parse(self, path: str, text: str) -> SourceFile | Finding:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SyntaxWarning for invalid escapes is not ours to report
                tree = ast.parse(text, filename=path)
        except SyntaxError as exc:
            return _syntax_error(path, exc)
        except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
            return _diagnostic(path, SYNTAX_ERROR, f"cannot parse: {exc or type(exc).__name__}", 1, 1)
        source = SourceFile(path, text, tree, self.project)
        source.lines = physical_lines(text)
        return source

    def check_text(self, path: str, text: str) -> list[Finding]:
        parsed = self._parse(path, text)
        if isinstance(parsed, Finding):
            return [parsed]
        if self.project is None:
            files = ProjectFiles([path])
            summary = self._summarize(parsed, files)
            parsed.project = ProjectIndex([summary] if summary else [], files)
            return self._run(parsed, self.rules)
        # With the other files known, as in the second pass: their pre-filter, not this file's text alone.
        rules = [r for r in self.rules if (getattr(r, "wanted_in_project", r.wanted) if uses_project(r)
                                           else r.wanted)(text)]
        return self._run(parsed, rules, prefiltered=True)

    def first_pass(self, path: str, files: ProjectFiles, keep_text: bool = False
                   ) -> tuple[FileResult, ModuleSummary | None]:
        """The file-local rules' findings (and E902/E999), and the file's summary for the index."""
        try:
            text = read_source(path)
        except UnreadableFile as exc:
            return FileResult(path, [_diagnostic(path, IO_ERROR, str(exc), exc.line, exc.column)]), None
        return self.first_pass_text(path, text, files, keep_text)

    def first_pass_text(self, path: str, text: str, files: ProjectFiles, keep_text: bool = False
                        ) -> tuple[FileResult, ModuleSummary | None]:
        parsed = self._parse(path, text)
        if isinstance(parsed, Finding):
            return FileResult(path, [parsed], text.count("\n") + 1), None
        own = ProjectIndex((), files)  # its resolver, made by the summary, serves the rules too
        parsed.project = own
        summary = self._summarize(parsed, files)
        if summary is not None:
            own.add(summary)
        # Every rule, the project ones with what this file alone shows; the runner checks again, with the
        # whole index, the files for which other files can change the answer (ProjectIndex.needs_project).
        if self.project is not None:
            parsed.project = self.project
        findings = self._run(parsed, self.rules)
        fixable = keep_text and any(f.fix and f.fix.edits for f in findings)
        return FileResult(path, findings, text.count("\n") + 1, text if fixable else None), summary

    def second_pass(self, path: str, keep_text: bool = False) -> FileResult:
        """The findings of the rules that ask the project index, with the whole index (the file parsed
        again); they replace those rules' findings of the first pass."""
        try:
            text = read_source(path)
        except UnreadableFile:
            return FileResult(path)
        return self.second_pass_text(path, text, keep_text)

    def second_pass_text(self, path: str, text: str, keep_text: bool = False) -> FileResult:
        rules = [r for r in self.rules if uses_project(r)]
        # a file whose `if` reads an attribute that holds a rank test bound in another file (`if
        # self.is_visualizer:`, set from a caller's `is_visualizer()`) is wanted by the rules that read rank
        # tests, whatever its own text shows
        ranked = self.project is not None and self.project.tests_rank_attribute(path)
        rules = [r for r in rules if getattr(r, "wanted_in_project", r.wanted)(text)
                 or ranked and getattr(r, "reads_rank_tests", False)]
        if not rules:
            return FileResult(path)
        parsed = self._parse(path, text)
        if isinstance(parsed, Finding):
            return FileResult(path)
        findings = self._run(parsed, rules, prefiltered=True)
        fixable = keep_text and any(f.fix and f.fix.edits for f in findings)
        return FileResult(path, findings, 0, text if fixable else None)

    def _summarize(self, source: SourceFile, files: ProjectFiles) -> ModuleSummary | None:
        if not any(uses_project(r) for r in self.rules):
            return None
        try:
            return summarize(source, files)
        except RecursionError:
            return None  # a file too deeply nested to summarise adds nothing to the index
        except Exception:
            if os.environ.get("DDPDOCTOR_DEBUG"):
                raise
            return None

    def _run(self, source: SourceFile, rules: list[Rule], prefiltered: bool = False) -> list[Finding]:
        path, text = source.path, source.text
        findings: list[Finding] = []
        for rule in rules:
            if not prefiltered and not rule.wanted(text):
                continue
            try:
                findings.extend(rule.check(source))
            except RecursionError:
                findings.append(
                    _diagnostic(path, SYNTAX_ERROR, f"{rule.code} skipped: nesting too deep", 1, 1)
                )
            except Exception as exc:  # a bug in one rule must not lose the other files
                if os.environ.get("DDPDOCTOR_DEBUG"):
                    raise
                findings.append(_diagnostic(
                    path, "E000", f"internal error in rule {rule.code}: {type(exc).__name__}: {exc} "
                    "(a bug in ddpdoctor; DDPDOCTOR_DEBUG=1 shows the traceback)", 1, 1))
        if findings:
            findings = without_noqa(findings, source.lines)
        return findings

    def check_path(self, path: str, keep_text: bool = False) -> FileResult:
        try:
            text = read_source(path)
        except UnreadableFile as exc:
            return FileResult(path, [_diagnostic(path, IO_ERROR, str(exc), exc.line, exc.column)])
        findings = self.check_text(path, text)
        fixable = keep_text and any(f.fix and f.fix.edits for f in findings)
        return FileResult(path, findings, text.count("\n") + 1, text if fixable else None)


def without_noqa(findings: list[Finding], lines: list[str]) -> list[Finding]:
    kept = []
    for finding in findings:
        loc = finding.location
        if finding.code in TOOL_CODES or loc is None or loc.line is None:
            kept.append(finding)
            continue
        candidates = {loc.line, loc.end_line or loc.line}
        if not any(_silences(lines[n - 1], finding.code) for n in candidates if 0 < n <= len(lines)):
            kept.append(finding)
    return kept


def _silences(line: str, code: str) -> bool:
    if "noqa" not in line.lower():
        return False
    for match in _NOQA.finditer(line):
        codes = match.group("codes")
        if codes is None:
            return True
        if any(code.startswith(c.strip().upper()) for c in codes.split(",")):
            return True
    return False


def _diagnostic(path: str, code: str, message: str, line: int | None, column: int | None) -> Finding:
    return Finding(
        class_=INPUT_ERROR_CLASS,
        code=code,
        severity=Severity.ERROR,
        message=message,
        locations=(Location(path, line, column),),
    )


def _syntax_error(path: str, exc: SyntaxError) -> Finding:
    # The grammar is the running interpreter's: a file written for a newer Python (3.12's `type X = ...`,
    # `def f[T]()`) fails here although it is valid there, so the message names the version it was read as.
    grammar = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    message = f"syntax error ({grammar}): {exc.msg}" if exc.msg else f"syntax error ({grammar})"
    return _diagnostic(path, SYNTAX_ERROR, message, exc.lineno or 1, exc.offset or 1)
