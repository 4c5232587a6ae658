#!/usr/bin/env bash
# The project's test command (README, `just test`, .ci/run): installs what the tests need when
# it is missing, then runs every check of the workspace. Redis tests start their own servers
# on free loopback ports, so nothing needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

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
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1 && command -v rustup >/dev/null; then
    rustup component add "$component"
  fi
done

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet
echo "== cargo test"
cargo test --workspace --all-features
