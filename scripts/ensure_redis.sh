#!/usr/bin/env bash
# Tests start their own redis-server on a free loopback port; install the binary if it is missing.
set -euo pipefail
command -v redis-server >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
else
  echo "redis-server is missing and apt-get is unavailable: install Redis to run the tier tests" >&2
  exit 1
fi
