#!/usr/bin/env bash
# What a crates.io user would get, checked before anything is published (run by
# scripts/test.sh; needs the crates.io index, nothing else from the network).
#
# 1. `cargo package` of the published crates, in dependency order against a local overlay
#    registry, so the path dependencies between them resolve before any is published.
# 2. The .crate files are unpacked into a scratch workspace (each other's versions patched in)
#    and built from there: a file the build reads from outside its crate, or a path dependency
#    without a version, fails here rather than on crates.io. (cargo's own verification step is
#    not used: it reuses what it unpacked on an earlier run of the same version, so it can
#    build stale sources.)
# 3. `rust-version`: rustup cannot fetch an older toolchain here, so the crates are not built
#    with that rustc. Instead, that scratch workspace is resolved by cargo's MSRV-aware
#    resolver, every dependency a user builds (normal and build dependencies, not
#    dev-dependencies) must then declare support for our rust-version, and step 2 builds
#    against exactly those versions. Clippy in scripts/test.sh adds its `incompatible_msrv`
#    lint (standard-library items stabilised after rust-version). Language features
#    stabilised later (async closures, say) are caught by none of these.
#
# The crates with `publish = false` (fairlock-bench, fairlock-testsupport, fairlock-faults)
# are left out.
set -euo pipefail
cd "$(dirname "$0")/.."

published=(fairlock fairlock-redis fairlock-postgres fairlock-cli)
packages=()
for crate in "${published[@]}"; do packages+=(-p "$crate"); done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
target=$(cargo metadata --no-deps --format-version 1 |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

echo "== cargo package ${published[*]}"
# --allow-dirty: this checks the working tree, so it also runs before a commit.
cargo package --quiet --no-verify --allow-dirty "${packages[@]}"

echo "== the packages, built on the oldest-Rust-compatible dependencies (rust-version $msrv)"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
{
  echo '[workspace]'
  echo 'resolver = "2"'
  printf 'members = ['
  printf '"%s-'"$version"'", ' "${published[@]}"
  echo ']'
  echo '[patch.crates-io]'
  for crate in "${published[@]}"; do
    echo "$crate = { path = \"$crate-$version\" }"
  done
} >"$scratch/Cargo.toml"
for crate in "${published[@]}"; do
  tar -xzf "$target/package/$crate-$version.crate" -C "$scratch"
done
# Fresh modification times: cargo's fingerprints keep paths relative to a package's root and
# compare times, so an unpacked file with an old time could pass for the last run's build.
find "$scratch" -type f -exec touch {} +
(
  cd "$scratch"
  cargo generate-lockfile --quiet --config 'resolver.incompatible-rust-versions="fallback"'
  # idna_adapter 1.2 pulls ICU4X crates that need Rust 1.83; 1.1.0 is the same API on the
  # unicode-rs crates, the version url's documentation gives for older compilers.
  cargo update --quiet -p idna_adapter --precise 1.1.0
  cargo metadata --locked --format-version 1 | python3 -c '
import json, sys
msrv, roots = sys.argv[1], set(sys.argv[2:])
def version(text):
    return tuple(int(part) for part in (text.split(".") + ["0", "0"])[:3])
meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
todo = [id for id, p in packages.items() if p["name"] in roots and p["source"] is None]
seen = set()
while todo:
    id = todo.pop()
    if id in seen:
        continue
    seen.add(id)
    for dep in nodes[id]["deps"]:
        if any(kind["kind"] in (None, "build") for kind in dep["dep_kinds"]):
            todo.append(dep["pkg"])
above = sorted(
    "{name} {version} needs Rust {rust_version}".format(**packages[id])
    for id in seen
    if packages[id].get("rust_version") and version(packages[id]["rust_version"]) > version(msrv)
)
if above:
    sys.exit("no versions declaring support for rust-version " + msrv + ":\n  " + "\n  ".join(above))
print("   %d crates, each declaring rust-version %s or lower, or none" % (len(seen), msrv))
' "$msrv" "${published[@]}"
  # A target directory of its own, kept, so the older versions are compiled once.
  CARGO_TARGET_DIR="$target/publish-check" cargo check --quiet --locked --all-features "${packages[@]}"
)
