#!/usr/bin/env bash
# The project's test command (README, `just test`, .ci/run): installs what the tests need when
# it is missing, then runs every check of the workspace. Redis tests start their own servers
# on free loopback ports, so nothing needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

# A CI machine builds once from nothing: incremental-compilation caches would only double the
# disk the build needs (see [profile.dev] in Cargo.toml).
if [[ "${CI:-}" == true ]]; then
  export CARGO_INCREMENTAL=0
fi
df -h . | awk 'NR == 2 { print "== disk: " $4 " free" }'

./scripts/install-deps.sh
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
# Packages the published crates and builds them as crates.io would serve them, on
# dependencies that support the declared rust-version (what that does and does not prove:
# see the script).
./scripts/check-publish.sh
echo "== cargo test"
cargo test --workspace --all-features
