#!/usr/bin/env bash
# Set up (idempotent) and run everything CI runs: lint, type check, the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
.venv/bin/ruff check .
.venv/bin/mypy
# The suite runs in parallel lanes (pytest-xdist workers): most of its time is 2-rank jobs, and a job leaves
# cores idle while its launcher imports torch alone, while a hang waits for --hang-after, while a test waits
# for a job to end. Tests that read one job share a lane (tests/lanes.py); each lane takes its ports from a
# block of its own (tests/ports.py); the leak check runs after every test in every lane (tests/conftest.py).
# One lane per core, at least 2 (the demo's lane runs two jobs at a time itself; more lanes than cores starve
# the jobs of CPU until their timeouts fire). DDPDOCTOR_TEST_LANES overrides it (1: one lane, no xdist).
cores=$(nproc 2>/dev/null || echo 2)
lanes=${DDPDOCTOR_TEST_LANES:-$(( cores < 2 ? 2 : cores ))}
lanes=$(( lanes > 8 ? 8 : lanes ))
if [ "$lanes" -le 1 ]; then
  .venv/bin/python -m pytest "$@"
else
  .venv/bin/python -m pytest -n "$lanes" --dist loadgroup "$@"
fi
