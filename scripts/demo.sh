#!/usr/bin/env bash
# Set up (idempotent) and run the demo: the catalogue's failures, caught live on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
status=0
.venv/bin/ddpdoctor demo "$@" || status=$?
# The command lives in this clone's .venv: say so, or a bare `ddpdoctor` from the README is "not found".
echo
echo "ddpdoctor is installed in $(pwd)/.venv: run it as $(pwd)/.venv/bin/ddpdoctor, or first 'source .venv/bin/activate'."
echo "To use it in your own environment (your torch is kept): pip install -e $(pwd)  (README: \"Use it on your project\")"
exit $status
