"""Open a log (file or stdin) and yield its text in blocks: bounded memory, decided encoding, no binaries."""

from __future__ import annotations

import codecs
import gzip
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import InputError

BLOCK_SIZE = 1 << 20
SNIFF_SIZE = 64 * 1024  # a NUL byte in the first 64 KiB means the input is not a text log
_RANK_IN_NAME = re.compile(r"(?:rank|default|worker|proc|process)[_\-.]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class LogSource:
    name: str  # as the user gave it; "-" is stdin
    rank: int | None = None  # when the file name says which rank wrote it (rank3.log, worker_3.err)

    @classmethod
    def from_arg(cls, name: str) -> LogSource:
        match = _RANK_IN_NAME.search(os.path.basename(name)) if name != "-" else None
        return cls(name, int(match.group(1)) if match else None)

    @property
    def label(self) -> str:
        return "<stdin>" if self.name == "-" else self.name


def check_readable(source: LogSource) -> None:
    """Fail early (before any output) on a missing file, a directory or an unreadable file."""
    if source.name == "-":
        return
    if not os.path.exists(source.name):
        raise InputError(f"{source.name}: no such file")
    if os.path.isdir(source.name):
        raise InputError(f"{source.name}: is a directory, not a log file")
    if not os.access(source.name, os.R_OK):
        raise InputError(f"{source.name}: permission denied")


_GZIP_MAGIC = b"\x1f\x8b"


def _open(source: LogSource) -> BinaryIO:
    """The raw log, gunzipped on the fly when it is gzip-compressed (`train.log.gz`, `zcat`-less pipes)."""
    try:
        raw: BinaryIO = sys.stdin.buffer if source.name == "-" else open(source.name, "rb")  # noqa: SIM115
        peek = getattr(raw, "peek", None)
        head = peek(2)[:2] if peek else b""
    except OSError as exc:
        raise InputError(f"{source.label}: cannot open: {exc.strerror or exc}") from exc
    if head == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _encoding(head: bytes) -> str:
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"  # PowerShell's `>` writes UTF-16 with a BOM
    return "utf-8-sig"


def read_blocks(source: LogSource, block_size: int = BLOCK_SIZE) -> Iterator[tuple[str, bool]]:
    """Yield (text, is_last) blocks of the decoded log. Raises InputError for binary or unreadable input."""
    stream = _open(source)
    try:
        try:
            head = stream.read(max(block_size, SNIFF_SIZE))
        except (OSError, EOFError) as exc:
            raise InputError(f"{source.label}: cannot read: {exc}") from exc
        encoding = _encoding(head)
        if encoding != "utf-16" and b"\x00" in head[:SNIFF_SIZE]:
            raise InputError(f"{source.label}: binary data (NUL bytes in the first 64 KiB), not a text log")
        decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        chunk = head
        while True:
            try:
                following = stream.read(block_size) if chunk else b""
            except (OSError, EOFError) as exc:  # also a corrupt or truncated .gz
                raise InputError(f"{source.label}: cannot read: {exc}") from exc
            last = not following
            text = decoder.decode(chunk, final=last)
            if text or last:
                yield text, last
            if last:
                return
            chunk = following
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()  # a GzipFile does not close the file it was given: close that too
        if isinstance(stream, gzip.GzipFile) and stream.fileobj is not None:
            inner = stream.fileobj
            if inner is not sys.stdin.buffer:
                inner.close()
