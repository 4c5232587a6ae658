# Convenience recipes; each calls the same scripts the README documents, so `just` is optional.

# The main job: fair locking on the embedded in-memory backend.
quickstart:
    cargo run --example quickstart

# Install what is missing, then run every check and test of the workspace.
test:
    ./scripts/test.sh

# Package the published crates and build them as crates.io would serve them (part of `test`).
check-publish:
    ./scripts/check-publish.sh

# Benchmarks against the round-trip limit on a private redis-server (docs/performance.md).
bench *ARGS:
    ./scripts/bench.sh {{ARGS}}
