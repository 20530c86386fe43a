#!/usr/bin/env bash
# The whole test suite: build the real binaries, run the interop suites (official Python
# and TypeScript SDKs, MCP conformance scenarios; installed from PyPI/npm on first use),
# then every unit and end-to-end test. `--no-interop` skips the interop suites.
set -euo pipefail
cd "$(dirname "$0")/.."
interop=1
if [ "${1:-}" = "--no-interop" ]; then
  interop=0
  shift
fi
cargo build --workspace --locked
if [ "$interop" = 1 ]; then
  bash scripts/interop-setup.sh
  bash scripts/interop.sh
fi
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast "$@"
else
  cargo test --workspace --locked --no-fail-fast "$@"
fi
