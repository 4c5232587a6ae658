#!/usr/bin/env bash
# Installs what the tests and benchmarks need and a fresh machine lacks: redis-server and
# redis-cli (real servers, started by the tests themselves) and faketime (clock-skew test).
# Uses apt when run as root; otherwise says what to install and fails.
set -euo pipefail

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v faketime >/dev/null || missing+=(faketime)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing: ${missing[*]}. Install them (Debian: sudo apt-get install -y ${missing[*]}) and re-run." >&2
    exit 1
  fi
fi
