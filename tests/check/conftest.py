from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpdoctor.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
# The fixtures are programs to check, not tests: some are pytest modules themselves (`test_*.py`, the shape a
# rule reads as a unit test), and importing them would need the libraries they use.
collect_ignore_glob = ["fixtures/*"]
EXPECTED = re.compile(r"#\s*error:\s*((?:DDP\d{3}[,\s]*)+)")


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def findings(self) -> list[dict]:
        return json.loads(self.out)


@pytest.fixture
def check(capsys):
    """Run `ddpdoctor check ARGS...` in this process, as the console script would."""

    def run(*args: str) -> Outcome:
        capsys.readouterr()
        try:
            code = main(["check", *args])
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Outcome(code, captured.out, captured.err)

    return run


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def expected():
    return expected_findings


def expected_findings(path: Path) -> set[tuple[int, str]]:
    """(line, code) for every `# error: DDPxxx` comment in a fixture."""
    found = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = EXPECTED.search(line)
        if match:
            found.update((number, code) for code in re.findall(r"DDP\d{3}", match.group(1)))
    return found
