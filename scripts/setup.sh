#!/usr/bin/env bash
# Create .venv and install ddpdoctor with everything the demo and the tests need. Idempotent: a second run
# with an unchanged pyproject.toml does nothing (a few ms).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
stamp=.venv/.ddpdoctor-setup
want=$(cat pyproject.toml scripts/setup.sh | "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/ddpdoctor ]; then
  exit 0
fi

echo "setting up .venv (first run: about a minute) ..." >&2
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch==2.13.0 first and exactly: it is the CPU build on this machine's disk; a bare `torch` requirement
# would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
echo "$want" > "$stamp"
