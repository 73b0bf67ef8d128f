#!/usr/bin/env bash
# Set up (idempotent) and run the demo: the catalogue's failures, caught live on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ddpdoctor demo "$@"
