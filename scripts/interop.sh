#!/usr/bin/env bash
# Run real third-party MCP clients against alexandria: the official Python SDK and
# TypeScript SDK over the stdio shim and over HTTP, the official conformance suite
# against /mcp/<slug>, a real Chromium clicking through the web view, and the Python
# SDK's OAuth client against remote access. Builds nothing: it expects target/debug/alexandria and
# alexandriad (`cargo build --workspace`) and the clients from scripts/interop-setup.sh.
# Prints one PASS/FAIL line per check and ends with `N passed, M failed`.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
python="$root/target/interop-venv/bin/python"
interop="$root/tests/interop"
node="$interop/node_modules/.bin/node"
conformance="$interop/node_modules/@modelcontextprotocol/conformance/dist/index.js"

for needed in "$bin/alexandria" "$bin/alexandriad" "$python" "$node" "$conformance"; do
    if [ ! -e "$needed" ]; then
        echo "missing $needed: run \`cargo build --workspace\` and \`bash scripts/interop-setup.sh\` first" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
done

home="$(mktemp -d /tmp/alx-interop.XXXXXX)"
logs="$home/interop-logs"
mkdir -p "$logs"
export ALEXANDRIA_HOME="$home" ALEXANDRIAD="$bin/alexandriad"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
unset ALEXANDRIA_LOG

cleanup() {
    "$bin/alexandria" daemon stop >/dev/null 2>&1
    rm -rf "$home"
}
trap cleanup EXIT

if ! "$bin/alexandria" daemon start --port 0 >"$logs/start.log" 2>&1; then
    cat "$logs/start.log"
    echo "0 passed, 1 failed"
    exit 1
fi
printf '# Lighthouses\n\nThe Fresnel lens made lighthouses visible for miles.\n' >"$home/notes.md"
"$bin/alexandria" ingest global "$home/notes.md" >/dev/null
url="$("$bin/alexandria" daemon status --json | "$python" -c 'import json, sys; print(json.load(sys.stdin)["http"])')"
echo "daemon at $url, home $home"

passed=0
failed=0
check() {
    local name="$1"
    shift
    local log="$logs/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_').log"
    if (cd "$interop" && timeout 180 "$@") >"$log" 2>&1; then
        passed=$((passed + 1))
        echo "PASS $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
        tail -n 25 "$log" | sed 's/^/    /'
    fi
}

# The Python SDK's default mode probes server/discover (2026-07-28) and falls back to
# initialize; legacy mode always initializes.
for mode in "auto 2026-07-28" "legacy 2025-11-25"; do
    set -- $mode
    check "python $1 stdio pinned" "$python" python_client.py --stdio "$bin/alexandria" --workspace global --mode "$1" --expect "$2"
    check "python $1 stdio open" "$python" python_client.py --stdio "$bin/alexandria" --mode "$1" --expect "$2"
    check "python $1 http /mcp/global" "$python" python_client.py --url "$url/mcp/global" --workspace global --mode "$1" --expect "$2"
    check "python $1 http /mcp" "$python" python_client.py --url "$url/mcp" --mode "$1" --expect "$2"
done

# An entry written by `alexandria mcp install`, started the way the SDK starts servers
# (its default environment: HOME, PATH, … but not the ALEXANDRIA_HOME exported above).
user_home="$home/user"
mkdir -p "$user_home"
"$bin/alexandria" workspace create first-day >/dev/null
HOME="$user_home" "$bin/alexandria" mcp install cursor >"$logs/install-cursor.log" 2>&1
check "python stdio entry from mcp install (SDK default environment)" env HOME="$user_home" "$python" python_entry.py "$user_home/.cursor/mcp.json" first-day

check "typescript stdio pinned" "$node" ts_client.mjs stdio "$bin/alexandria" global
check "typescript stdio open" "$node" ts_client.mjs stdio "$bin/alexandria"
check "typescript http /mcp/global" "$node" ts_client.mjs http "$url/mcp/global" global
check "typescript http /mcp" "$node" ts_client.mjs http "$url/mcp"

# Wiki pages as resources: list, templates, read, subscribe and an update after a write.
check "python resources stdio pinned" "$python" python_resources.py --stdio "$bin/alexandria" --workspace global
check "python resources stdio open" "$python" python_resources.py --stdio "$bin/alexandria" --listen
check "python resources http /mcp/global" "$python" python_resources.py --url "$url/mcp/global" --workspace global --listen
check "python resources http /mcp" "$python" python_resources.py --url "$url/mcp"
check "typescript resources stdio pinned" "$node" ts_resources.mjs stdio "$bin/alexandria" global
check "typescript resources http /mcp" "$node" ts_resources.mjs http "$url/mcp"

for scenario in server-initialize ping tools-list server-sse-multiple-streams dns-rebinding-protection; do
    check "conformance $scenario /mcp/global" "$node" "$conformance" server --url "$url/mcp/global" --scenario "$scenario"
done

# The web view in a real browser: Debian's Chromium driven by playwright-core clicks
# through login, pages, citations, search, history, the subscription buttons, sign-out.
check "browser click-through of the web view (chromium)" "$node" web_browser.mjs "$bin/alexandria" "$root/target/web-screenshots/browser"

# Remote access: the Python SDK's OAuth client (dynamic registration, consent page with
# a pairing code, PKCE, audience-bound token) against the daemon's own loopback URL as
# the public URL. Last, because remote access makes every HTTP request need a token.
"$bin/alexandria" workspace create other >/dev/null
if "$bin/alexandria" remote enable --public-url "$url" >"$logs/remote.log" 2>&1; then
    check "python oauth /mcp/global" "$python" python_oauth.py --url "$url/mcp/global" --alexandria "$bin/alexandria"
    check "python oauth legacy /mcp/global" "$python" python_oauth.py --url "$url/mcp/global" --alexandria "$bin/alexandria" --mode legacy
    # The consent page in a real browser (a person approving Claude.ai's connection).
    check "browser consent page (chromium)" "$node" oauth_browser.mjs "$bin/alexandria" "$url" "$root/target/web-screenshots/oauth"
else
    failed=$((failed + 1))
    echo "FAIL remote enable"
    sed 's/^/    /' "$logs/remote.log"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
