"""How many known, real bugs does `ddpdoctor check` find, and how many clean files does it flag?

    .venv/bin/python benchmarks/realworld.py CORPUS.tsv CHECKOUTS [--jobs N] [--verbose]

CORPUS.tsv lists public repositories at pinned commits (columns: kind, repo, path, commit, lines, rule,
justification, evidence; see the corpus README). CHECKOUTS holds one checked-out tree per (repo, commit),
named `<owner>+<name>@<first 8 hex of the commit>`. Each tree is checked whole, as a user runs
`ddpdoctor check .` in it (the command itself, in a subprocess, JSON output, all rules).

A `pos` row is found when its rule is reported in its file at one of its lines, give or take 2; a `neg` row
is flagged when any DDP rule is reported in its file; a row whose justification starts with `skip:` is not
counted. Not part of the test suite: it needs the checkouts, which are third-party code kept outside the
repository.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass

SLACK = 2


@dataclass(frozen=True)
class Row:
    kind: str
    repo: str
    path: str
    commit: str
    lines: frozenset[int]
    rule: str
    skipped: bool

    @property
    def tree(self) -> str:
        return f"{self.repo.replace('/', '+')}@{self.commit[:8]}"


def parse_lines(text: str) -> frozenset[int]:
    found: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            found.update(range(int(low), int(high) + 1))
        else:
            found.add(int(part))
    return frozenset(found)


def read_corpus(path: str) -> list[Row]:
    rows = []
    with open(path, encoding="utf-8", newline="") as handle:
        for record in csv.DictReader(handle, delimiter="\t"):
            rows.append(Row(record["kind"], record["repo"], record["path"], record["commit"],
                            parse_lines(record["lines"]), record["rule"].split()[0],
                            record["justification"].strip().startswith("skip:")))
    return rows


def check_tree(root: str, jobs: int | None) -> list[dict]:
    command = [
        sys.executable,
        "-m",
        "ddpdoctor",
        "check",
        ".",
        "--isolated",
        "--format",
        "json",
        "--exit-zero",
        "--no-progress",
    ]
    if jobs:
        command += ["--jobs", str(jobs)]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"check failed in {root}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout or "[]")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus")
    parser.add_argument("checkouts")
    parser.add_argument("--jobs", type=int)
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="print the findings of each counted file"
    )
    args = parser.parse_args()

    rows = read_corpus(args.corpus)
    findings: dict[str, list[dict]] = {}
    for tree in sorted({row.tree for row in rows}):
        root = os.path.join(args.checkouts, tree)
        if not os.path.isdir(root):
            print(f"missing checkout: {root}", file=sys.stderr)
            return 2
        findings[tree] = check_tree(root, args.jobs)

    def in_file(row: Row) -> list[dict]:
        return [f for f in findings[row.tree] if os.path.normpath(f["path"]) == os.path.normpath(row.path)
                and f["code"].startswith("DDP")]

    found, missed, flagged, clean = [], [], [], []
    for row in rows:
        if row.skipped:
            continue
        here = in_file(row)
        if row.kind == "pos":
            hit = [
                f
                for f in here
                if f["code"] == row.rule and any(abs(f["line"] - n) <= SLACK for n in row.lines)
            ]
            (found if hit else missed).append((row, hit or here))
        else:
            (flagged if here else clean).append((row, here))
    positives = len(found) + len(missed)
    negatives = len(flagged) + len(clean)
    print(f"recall: {len(found)}/{positives} positives found at their lines (±{SLACK})")
    print(f"flagged clean files: {len(flagged)}/{negatives}")
    print(f"files checked: {sum(1 for _ in findings)} trees")
    for title, group in (("found", found), ("missed", missed), ("flagged", flagged)):
        if not group:
            continue
        print(f"\n{title}:")
        for row, here in group:
            lines = ",".join(str(n) for n in sorted(row.lines))
            print(f"  {row.repo} {row.path} [{row.rule} at {lines}]")
            if title != "found" or args.verbose:
                for f in here:
                    print(f"      {f['line']}: {f['code']} {f['message'][:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
