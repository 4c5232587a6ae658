#!/usr/bin/env bash
# The benchmark (README, `just bench`): installs redis-server if missing, then runs
# fairlock-bench in release mode on its own redis-server. Extra arguments go to fairlock-bench
# (e.g. --quick, --only handoff, --pool-size 8).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
exec cargo run --release --quiet -p fairlock-bench -- "$@"
