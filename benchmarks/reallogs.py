"""How often `ddpdoctor explain` is right on logs that users pasted into public issue threads.

    .venv/bin/python benchmarks/reallogs.py [FOLDER] [--manifest benchmarks/reallogs.tsv] [--verbose]

`benchmarks/reallogs.tsv` points at public threads whose root cause the thread established (columns: file,
url, the excerpt's first and last line, expected, cause). The excerpts themselves are third-party text and
live outside the repository (FOLDER, one file per row, default /work/shared/reallogs); none may be copied
into the project. Each file is explained the way a user runs it: `ddpdoctor explain FILE --format json`, in
a subprocess.

`expected` is a catalogue class slug (`collective-timeout`), several accepted ones separated by `|`, or
`other:NAME` for a distributed error outside the catalogue, which `explain` reports as the class
`distributed-error` with the fact `error` naming what it is. A row scores:

- right: the best diagnosis is the expected class (for `other:NAME`, a `distributed-error` whose `error`
  is NAME);
- partly: the expected class is among the diagnoses but not first, or (for `other:`) the first distributed
  error was found but named differently;
- unsure: nothing diagnosed (explain says in one line what the log is instead, and exits 1);
- wrong: anything else, also a hedged guess ("the log just stops: likely a hang") about a log that shows an
  error; those above confidence 0.5 are counted apart (they mislead).
"""

from __future__ import annotations

import argparse
import csv
import enum
import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

MISLEADING = 0.5
OTHER = "distributed-error"
DEFAULT_FOLDER = "/work/shared/reallogs"


class Score(enum.Enum):
    RIGHT = "right"
    PARTLY = "partly"
    UNSURE = "unsure"
    WRONG = "wrong"


@dataclass(frozen=True)
class Row:
    file: str
    url: str
    expected: str
    cause: str


@dataclass(frozen=True)
class Diagnosed:
    slug: str
    confidence: float
    error: str  # the `error` fact of a distributed-error finding


@dataclass(frozen=True)
class Result:
    row: Row
    score: Score
    found: tuple[Diagnosed, ...]

    @property
    def misleading(self) -> bool:
        return self.score is Score.WRONG and bool(self.found) and self.found[0].confidence > MISLEADING


def read_manifest(path: Path) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            Row(r["file"], r["url"], r["expected"], r["cause"])
            for r in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        ]


def explain(path: Path) -> tuple[Diagnosed, ...]:
    done = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "explain", str(path), "--format", "json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"explain failed on {path} ({done.returncode}): {done.stderr.strip()}")
    findings = json.loads(done.stdout or "[]")
    return tuple(
        Diagnosed(f["class"], float(f.get("confidence") or 0.0), str(f.get("facts", {}).get("error", "")))
        for f in findings
    )


def score(row: Row, found: tuple[Diagnosed, ...]) -> Score:
    if not found:
        return Score.UNSURE
    best = found[0]
    if row.expected.startswith("other:"):
        name = row.expected.split(":", 1)[1]
        if best.slug == OTHER and best.error == name:
            return Score.RIGHT
        if best.slug == OTHER or any(d.slug == OTHER and d.error == name for d in found):
            return Score.PARTLY
    else:
        accepted = set(row.expected.split("|"))
        if best.slug in accepted:
            return Score.RIGHT
        if any(d.slug in accepted for d in found):
            return Score.PARTLY
    return Score.WRONG


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=DEFAULT_FOLDER)
    parser.add_argument("--manifest", default=str(Path(__file__).with_name("reallogs.tsv")))
    parser.add_argument("--verbose", action="store_true", help="one line per log")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    results = []
    for row in read_manifest(Path(args.manifest)):
        path = folder / row.file
        if not path.is_file():
            print(f"missing: {path}", file=sys.stderr)
            continue
        found = explain(path)
        results.append(Result(row, score(row, found), found))
    for result in results if args.verbose else ():
        best = result.found[0] if result.found else None
        said = f"{best.slug}{'/' + best.error if best.error else ''} {best.confidence:.2f}" if best else "-"
        flag = " (misleading)" if result.misleading else ""
        row = result.row
        print(f"{result.score.value:7} {row.file:40} expected {row.expected:28} got {said}{flag}")
    counts = Counter(r.score for r in results)
    total = len(results)
    good = counts[Score.RIGHT] + counts[Score.UNSURE]
    print(
        f"{total} logs: right {counts[Score.RIGHT]}, partly {counts[Score.PARTLY]}, "
        f"unsure {counts[Score.UNSURE]}, wrong {counts[Score.WRONG]} "
        f"({sum(r.misleading for r in results)} above {MISLEADING}); "
        f"right or unsure {100 * good / max(total, 1):.0f} %"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
