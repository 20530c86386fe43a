#!/usr/bin/env bash
# The whole test suite: build the real binaries, then run every test (unit tests and the
# end-to-end tests in tests/, which start real alexandriad/alexandria processes).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --locked
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast "$@"
else
  cargo test --workspace --locked --no-fail-fast "$@"
fi
