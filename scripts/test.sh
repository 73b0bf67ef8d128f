#!/usr/bin/env bash
# Set up (idempotent) and run everything CI runs: lint, type check, the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
