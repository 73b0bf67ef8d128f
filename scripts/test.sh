#!/usr/bin/env bash
# Set up (idempotent) and run everything CI runs: lint, type check, the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
.venv/bin/ruff check .
.venv/bin/mypy
# The suite runs in parallel lanes (pytest-xdist workers): tests that read one job share a lane
# (tests/lanes.py), each lane takes its ports from a block of its own below the ephemeral range
# (tests/ports.py), the leak check runs after every test in every lane (tests/conftest.py). Lanes: one more
# than the cores (3 here), DDPDOCTOR_TEST_LANES=N overrides (1: no xdist). A 2-rank job spends most of its
# time waiting (a --hang-after, a gloo timeout, a peer still importing torch): `ddpdoctor demo --only F4`
# used 44 CPU-seconds in 102 s. Measured on this 2-core machine, shared with other work (load 6-15), on
# tests/guard/test_run_causes.py + test_invisible.py (16 tests): 1 lane 290 s, 2 lanes 298 s, 3 lanes 227 s.
# --durations: every run prints its 40 slowest tests, the profile the suite's time budget is worked from.
lanes=${DDPDOCTOR_TEST_LANES:-$(( $(nproc) + 1 ))}
lanes=$(( lanes > 8 ? 8 : lanes ))
if [ "$lanes" -le 1 ]; then
  .venv/bin/python -m pytest --durations=40 "$@"
else
  .venv/bin/python -m pytest --durations=40 -n "$lanes" --dist loadgroup "$@"
fi
