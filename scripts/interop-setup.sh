#!/usr/bin/env bash
# Install the third-party MCP clients that scripts/interop.sh runs, from the registries:
#   - the official Python SDK (PyPI `mcp`) into a venv at target/interop-venv
#   - the official TypeScript SDK, the conformance suite, Node 22 and playwright-core
#     (npm packages `@modelcontextprotocol/sdk`, `@modelcontextprotocol/conformance`,
#     `node@22`, `playwright-core`: drives Debian's Chromium, downloads no browser)
#     into tests/interop/node_modules, from tests/interop/package-lock.json
# Idempotent: a second run with everything in place changes nothing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/interop-venv"
python_sdk="mcp==2.3.0"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("mcp") != "2.3.0")' 2>/dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$python_sdk"
fi

cd "$root/tests/interop"
# `npm ci` reinstalls from scratch; skip it when this lockfile was installed already.
stamp=node_modules/.installed-lock.json
if ! cmp -s package-lock.json "$stamp" 2>/dev/null || ! node_modules/.bin/node --version >/dev/null 2>&1; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json "$stamp"
fi
version_of() {
    node_modules/.bin/node -p "JSON.parse(require('fs').readFileSync('node_modules/$1/package.json')).version"
}
echo "interop clients: python mcp $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))'), node $(node_modules/.bin/node --version), @modelcontextprotocol/sdk $(version_of @modelcontextprotocol/sdk), @modelcontextprotocol/conformance $(version_of @modelcontextprotocol/conformance)"
