#!/usr/bin/env bash
# The HTML report is tested in real headless Chromium: Debian's package (playwright drives it; it never
# downloads a browser of its own). Idempotent; needs root and Debian's package archive the first time.
# Never fails: without chromium the browser test is skipped with its reason (and fails under CI=true).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium is missing and cannot be installed here (needs root and apt-get): the HTML report test will be skipped" >&2
  exit 0
fi
echo "installing Debian's chromium for the HTML report test (once, about 30 s) ..." >&2
if ! { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
  echo "apt-get could not install chromium: the HTML report test will be skipped" >&2
fi
