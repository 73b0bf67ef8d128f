"""The width every command renders at (render/console.py): a terminal's own, COLUMNS, or a wide one for a
file or a pipe, where rich alone would take 80 columns and cut table cells with an ellipsis."""

from __future__ import annotations

import fcntl
import os
import struct
import termios
from pathlib import Path

import pytest

from ddpdoctor.render.console import PIPE_WIDTH, make_console


def test_a_file_without_columns_is_rendered_wide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    with open(tmp_path / "out.txt", "w", encoding="utf-8") as handle:
        assert make_console(file=handle).width == PIPE_WIDTH
    assert PIPE_WIDTH > 80


def test_columns_is_respected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "97")
    with open(tmp_path / "out.txt", "w", encoding="utf-8") as handle:
        assert make_console(file=handle).width == 97


def test_a_terminal_is_rendered_at_its_own_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    leader, follower = os.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 93, 0, 0))
        with open(follower, "w", encoding="utf-8", closefd=False) as terminal:
            assert make_console(file=terminal).width == 93
    finally:
        os.close(follower)
        os.close(leader)
