#!/usr/bin/env bash
# Set up (idempotent) and run everything CI runs: lint, type check, the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/browser.sh
.venv/bin/ruff check .
.venv/bin/mypy
# The suite can run in parallel lanes (pytest-xdist workers, DDPDOCTOR_TEST_LANES=N): tests that read one
# job share a lane (tests/lanes.py), each lane takes its ports from a block of its own (tests/ports.py), the
# leak check runs after every test in every lane (tests/conftest.py). One lane is the default: on 2 cores,
# two lanes took 25.5 min for 1,040 tests (other work on the machine; one lane took 21 min for 892 the round
# before), and Lightning's examples, which pick their own port,
# collided across lanes (TCPStore: address in use); lanes pay where there are more cores than jobs need.
# --durations: every run prints its 40 slowest tests, the profile the suite's time budget is worked from.
lanes=${DDPDOCTOR_TEST_LANES:-1}
lanes=$(( lanes > 8 ? 8 : lanes ))
if [ "$lanes" -le 1 ]; then
  .venv/bin/python -m pytest --durations=40 "$@"
else
  .venv/bin/python -m pytest --durations=40 -n "$lanes" --dist loadgroup "$@"
fi
