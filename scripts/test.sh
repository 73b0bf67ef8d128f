#!/usr/bin/env bash
# Set up (idempotent) and run everything CI runs: lint, type check, the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
.venv/bin/ruff check .
.venv/bin/mypy
# Two tests at a time (at most 4 on a bigger machine): most of a test's time is its 2-rank job waiting
# (for a hang to be reported, for a peer), not CPU. The demo and the example tests share one worker.
workers=$(nproc 2>/dev/null || echo 2)
workers=$(( workers < 2 ? 2 : (workers > 4 ? 4 : workers) ))
.venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
