#!/usr/bin/env bash
# The dashboard tests drive Debian's Chromium headless (through playwright's Python client, which
# is told the binary's path and downloads no browser); install it if it is missing.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "chromium is missing and apt-get is unavailable: install Chromium to run the dashboard tests" >&2
  exit 1
fi
