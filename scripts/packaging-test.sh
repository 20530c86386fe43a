#!/usr/bin/env bash
# Install alexandria the ways its users do, without a Rust toolchain, and check each one
# end to end with the official MCP Python SDK as the client (issue 13):
#   - build the wheel once (maturin, release profile), install it into a fresh venv on a
#     PATH without cargo: --version, init, mcp serve (open and --workspace global),
#     mcp install claude-code and the entry it wrote; uv tool install and pipx install put
#     both binaries on PATH
#   - uvx: `mcp install` run from uv's cache writes `uvx alexandria …`, and that entry
#     still starts after the cache is deleted
#   - the release archive and the Claude Desktop bundle made from the wheel's binaries:
#     `mcpb validate`, the entry Claude Desktop computes (via the mcpb package) starts,
#     open and pinned; install.sh --from a local HTTP server installs, and refuses an
#     archive whose checksum does not match
# Tools come from PyPI/npm (maturin, uv, pipx into target/packaging-venv; the MCP SDK via
# scripts/interop-setup.sh; @anthropic-ai/mcpb into tests/packaging/node_modules).
#
#   scripts/packaging-test.sh [--profile release|dev] [--no-build]
#
# --profile picks the cargo profile of the wheel (default release, what a release ships).
# CI passes `dev`: the checks are about packaging, not speed, and a dev wheel reuses the
# debug build CI has already made (seconds) where a release build of every dependency takes
# many minutes on 2 cores. --no-build reuses target/wheels.
# Prints PASS/FAIL per check, ends with `N passed, M failed`.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build=1
profile=release
while [ $# -gt 0 ]; do
    case $1 in
        --no-build) build=0; shift ;;
        --profile) profile=$2; shift 2 ;;
        *) echo "usage: packaging-test.sh [--profile release|dev] [--no-build]" >&2; exit 2 ;;
    esac
done
tools="$root/target/packaging-venv"
wheels="$root/target/wheels"
sdk_python="$root/target/interop-venv/bin/python"
node_dir="$root/tests/packaging"
client="$root/tests/packaging/entry_client.py"

echo "== packaging tools"
[ -x "$tools/bin/python" ] || python3 -m venv "$tools"
"$tools/bin/pip" install --quiet --disable-pip-version-check maturin==1.16.0 uv==0.13.9 pipx==1.18.4
bash "$root/scripts/interop-setup.sh" >/dev/null
(cd "$node_dir" && { cmp -s package-lock.json node_modules/.installed-lock.json 2>/dev/null \
    || { npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.installed-lock.json; }; })
mcpb="$node_dir/node_modules/.bin/mcpb"
echo "maturin $("$tools/bin/maturin" --version | awk '{print $2}'), $("$tools/bin/uv" --version), pipx $("$tools/bin/pipx" --version), mcpb $("$mcpb" --version)"

if [ "$build" = 1 ]; then
    echo "== wheel (maturin build --profile $profile)"
    rm -rf "$wheels"
    start=$(date +%s)
    if ! (cd "$root" && "$tools/bin/maturin" build --profile "$profile" --locked --out "$wheels"); then
        echo "the wheel did not build; an unresolved crate means a dependency of shim/ or of the daemon's main.rs is missing from packaging/wheel/Cargo.toml (that crate compiles both mains)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    echo "wheel built in $(($(date +%s) - start)) s"
fi
wheel="$(ls "$wheels"/alexandria-*.whl 2>/dev/null | head -n 1)"
if [ -z "$wheel" ]; then
    echo "no wheel in $wheels: run without --no-build" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

scratch="$(mktemp -d /tmp/alx-pkg.XXXXXX)"
logs="$scratch/logs"
mkdir -p "$logs"
daemons=()
cleanup() {
    for home in "${daemons[@]}"; do
        ALEXANDRIA_HOME="$home" "$scratch/venv/bin/alexandria" daemon stop >/dev/null 2>&1
    done
    [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null
    rm -rf "$scratch"
}
trap cleanup EXIT
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
unset ALEXANDRIA_LOG ALEXANDRIA_WORKSPACE ALEXANDRIAD
# A PATH with the system tools (git, tar, sha256sum) and nothing from Rust.
base_path="/usr/local/bin:/usr/bin:/bin"

passed=0
failed=0
check() {
    local name="$1"
    shift
    local log="$logs/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_').log"
    # Commands get a time limit; the shell functions below bound their own waits (the
    # client's read timeout, --no-index installs).
    local limit=()
    [ "$(type -t "$1")" = file ] && limit=(timeout 300)
    if ("${limit[@]}" "$@") >"$log" 2>&1; then
        passed=$((passed + 1))
        echo "PASS $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
        tail -n 25 "$log" | sed 's/^/    /'
    fi
}
# The `alexandria` entry in a client's JSON config file, for entry_client.py.
entry_of() {
    "$sdk_python" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["mcpServers"]["alexandria"]))' "$1"
}
# Stop the daemon of this home when the script ends.
owns() {
    daemons+=("$1")
}

# --- the wheel ---------------------------------------------------------------------------
wheel_holds_both() {
    "$sdk_python" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
scripts = sorted(n.rsplit("/", 1)[1] for n in names if ".data/scripts/" in n)
print(sys.argv[1].rsplit("/", 1)[1], scripts)
assert scripts == ["alexandria", "alexandriad"], scripts
EOF
}
check "wheel holds alexandria and alexandriad as scripts" wheel_holds_both
echo "    $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
extracted="$scratch/from-wheel"
"$sdk_python" - "$wheel" "$extracted" <<'EOF'
import os, sys, zipfile
wheel, out = sys.argv[1:]
os.makedirs(out)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if ".data/scripts/" in name:
            path = os.path.join(out, name.rsplit("/", 1)[1])
            with open(path, "wb") as f:
                f.write(z.read(name))
            os.chmod(path, 0o755)
EOF

# --- pip install into a fresh venv, no cargo on PATH --------------------------------------
venv="$scratch/venv"
home_pip="$scratch/home-pip"
mkdir -p "$home_pip"
python3 -m venv "$venv"
t0=$(date +%s.%N)
pip_install() {
    PATH="$venv/bin:$base_path" HOME="$home_pip" "$venv/bin/pip" install --quiet --no-index --disable-pip-version-check "$wheel"
    t_installed=$(date +%s.%N)
}
pip_install >"$logs/pip.log" 2>&1 || { cat "$logs/pip.log"; echo "0 passed, 1 failed"; exit 1; }
# Everything below runs as a user without Rust: only the venv and system tools on PATH.
user_env=(env -u CARGO_HOME -u RUSTUP_HOME PATH="$venv/bin:$base_path" HOME="$home_pip" ALEXANDRIA_HOME="$home_pip/.alexandria")
owns "$home_pip/.alexandria"
no_cargo() {
    ! "${user_env[@]}" sh -c 'command -v cargo || command -v rustc'
}
check "the user's PATH has no cargo or rustc" no_cargo
on_path() {
    [ "$("${user_env[@]}" sh -c 'command -v alexandria')" = "$venv/bin/alexandria" ] \
        && [ "$("${user_env[@]}" sh -c 'command -v alexandriad')" = "$venv/bin/alexandriad" ]
}
check "pip put alexandria and alexandriad on PATH" on_path
check "alexandria --version" "${user_env[@]}" sh -c 'alexandria --version | grep -x "alexandria [0-9][0-9.]*.*"'
check "alexandria init" "${user_env[@]}" alexandria init
daemon_is_the_venvs() {
    local pid
    pid=$("${user_env[@]}" alexandria daemon status --json | "$sdk_python" -c 'import json, sys; print(json.load(sys.stdin)["pid"])')
    [ "$(readlink -f "/proc/$pid/exe")" = "$(readlink -f "$venv/bin/alexandriad")" ]
}
check "the shim started the alexandriad beside it" daemon_is_the_venvs
echo "{\"command\": \"alexandria\", \"args\": [\"mcp\", \"serve\"]}" >"$scratch/open.json"
echo "{\"command\": \"alexandria\", \"args\": [\"mcp\", \"serve\", \"--workspace\", \"global\"]}" >"$scratch/pinned.json"
first_call() {
    "${user_env[@]}" "$sdk_python" "$client" "$scratch/open.json" --expect open --write | tee "$scratch/first-call.out"
}
check "mcp serve (open) with the Python SDK" first_call
check "mcp serve --workspace global with the Python SDK" "${user_env[@]}" "$sdk_python" "$client" "$scratch/pinned.json" --expect pinned:global --write
first_at=$(sed -n 's/^first_tool_call_at=//p' "$scratch/first-call.out")
if [ -n "$first_at" ]; then
    echo "    pip install took $(awk "BEGIN { printf \"%.2f\", $t_installed - $t0 }") s; pip install to first tool call (with --version, init): $(awk "BEGIN { printf \"%.2f\", $first_at - $t0 }") s"
fi
claude_code_entry() {
    "${user_env[@]}" alexandria mcp install claude-code | tee "$scratch/install.out" || return 1
    entry_of "$home_pip/.claude.json" >"$scratch/claude-code.json" || return 1
    cat "$scratch/claude-code.json"
    grep -q "\"command\": \"$(readlink -f "$venv/bin/alexandria")\"" "$scratch/claude-code.json" || return 1
    ! grep -q "^note:" "$scratch/install.out" || return 1
    "${user_env[@]}" "$sdk_python" "$client" "$scratch/claude-code.json" --expect open
}
check "mcp install claude-code writes the venv's path, and the entry starts" claude_code_entry

# --- uv tool install and pipx install -----------------------------------------------------
uv_tool() {
    local dir="$scratch/uv-tool"
    UV_TOOL_DIR="$dir/tools" UV_TOOL_BIN_DIR="$dir/bin" UV_CACHE_DIR="$dir/cache" \
        "$tools/bin/uv" tool install --no-index --find-links "$wheels" alexandria || return 1
    ls -l "$dir/bin"
    [ -x "$dir/bin/alexandria" ] && [ -x "$dir/bin/alexandriad" ] && "$dir/bin/alexandria" --version
}
check "uv tool install puts both binaries on PATH" uv_tool
pipx_install() {
    local dir="$scratch/pipx"
    PIPX_HOME="$dir/home" PIPX_BIN_DIR="$dir/bin" PIPX_MAN_DIR="$dir/man" \
        "$tools/bin/pipx" install --pip-args=--no-index "$wheel" || return 1
    ls -l "$dir/bin"
    [ -x "$dir/bin/alexandria" ] && [ -x "$dir/bin/alexandriad" ] && "$dir/bin/alexandria" --version
}
check "pipx install puts both binaries on PATH" pipx_install

# --- uvx: an entry that survives uv's cache -----------------------------------------------
home_uvx="$scratch/home-uvx"
mkdir -p "$home_uvx"
owns "$home_uvx/.alexandria"
uvx_env=(env PATH="$tools/bin:$base_path" HOME="$home_uvx" ALEXANDRIA_HOME="$home_uvx/.alexandria"
    UV_CACHE_DIR="$scratch/uv-cache" UV_NO_INDEX=1 UV_FIND_LINKS="$wheels")
uvx_entry() {
    "${uvx_env[@]}" uvx alexandria init || return 1
    "${uvx_env[@]}" uvx alexandria mcp install claude-code | tee "$scratch/uvx-install.out" || return 1
    grep -q "^note: this alexandria runs from uv's cache" "$scratch/uvx-install.out" || return 1
    entry_of "$home_uvx/.claude.json" >"$scratch/uvx.json" || return 1
    cat "$scratch/uvx.json"
    "$sdk_python" - "$scratch/uvx.json" "$tools/bin/uvx" <<'EOF' || return 1
import json, sys
entry = json.load(open(sys.argv[1]))
assert entry["command"] == sys.argv[2], entry
assert entry["args"] == ["alexandria", "mcp", "serve"], entry
EOF
    if "${uvx_env[@]}" uvx alexandria daemon install-service --dry-run 2>"$scratch/uvx-service.err"; then
        echo "install-service accepted a daemon inside uv's cache"
        return 1
    fi
    grep -q "lives in uv's cache" "$scratch/uvx-service.err" || return 1
    rm -rf "$scratch/uv-cache"
    "${uvx_env[@]}" "$sdk_python" "$client" "$scratch/uvx.json" --expect open --write || return 1
    # doctor reads the uvx entry as ours: the command is uvx, the arguments after
    # `alexandria` are checked (its exit code also reflects unrelated checks).
    "${uvx_env[@]}" uvx alexandria doctor --json >"$scratch/uvx-doctor.json"
    "$sdk_python" - "$scratch/uvx-doctor.json" <<'EOF'
import json, sys
findings = json.load(open(sys.argv[1]))["findings"]
ours = [f for f in findings if f["check"] == "client:claude-code"]
print(ours)
assert ours and all(f["status"] == "ok" and "through uvx" in f["message"] for f in ours), findings
EOF
}
check "uvx: mcp install writes 'uvx alexandria mcp serve', which starts after the cache is deleted; install-service refuses" uvx_entry

# --- release archive and Claude Desktop bundle --------------------------------------------
release="$scratch/release"
check "dist.sh makes the archive, the bundle (mcpb validate, mcpb pack) and SHA256SUMS" \
    sh "$root/packaging/dist.sh" --bin-dir "$extracted" --out "$release" --mcpb "$mcpb"
bundle="$(ls "$release"/*.mcpb 2>/dev/null | head -n 1)"
archive="$(ls "$release"/*.tar.gz 2>/dev/null | head -n 1)"
[ -n "$bundle" ] && echo "    $(basename "$bundle"): $(du -k "$bundle" | cut -f1) KiB"
[ -n "$archive" ] && echo "    $(basename "$archive"): $(du -k "$archive" | cut -f1) KiB"
unpacked="$scratch/bundle"
bundle_unpacks() {
    "$mcpb" unpack "$bundle" "$unpacked" && "$mcpb" validate "$unpacked/manifest.json" \
        && [ -x "$unpacked/server/alexandria" ] && [ -x "$unpacked/server/alexandriad" ]
}
check "the bundle unpacks with executable binaries and validates" bundle_unpacks
home_desktop="$scratch/home-desktop"
mkdir -p "$home_desktop"
owns "$home_desktop/.alexandria"
owns "$scratch/desktop-home"
desktop_env=(env -u ALEXANDRIA_HOME PATH="$base_path" HOME="$home_desktop")
bundle_open() {
    # No `alexandria init` first: a bundle user has no terminal; the bundle's entry sets
    # the home up on first use (`mcp serve --init-if-missing`).
    [ ! -e "$home_desktop/.alexandria" ] || return 1
    (cd "$node_dir" && node mcpb_entry.mjs "$unpacked" '{}') >"$scratch/desktop-open.json" || return 1
    cat "$scratch/desktop-open.json"
    "${desktop_env[@]}" "$sdk_python" "$client" "$scratch/desktop-open.json" --expect open --write || return 1
    ls "$home_desktop/.alexandria/workspaces/global/wiki" | grep -q '^packaging-'
}
check "bundle, settings left empty: open mode on ~/.alexandria, set up on first use" bundle_open
bundle_pinned() {
    [ ! -e "$scratch/desktop-home" ] || return 1
    (cd "$node_dir" && node mcpb_entry.mjs "$unpacked" "{\"workspace\": \"global\", \"home\": \"$scratch/desktop-home\"}") >"$scratch/desktop-pinned.json" || return 1
    cat "$scratch/desktop-pinned.json"
    "${desktop_env[@]}" "$sdk_python" "$client" "$scratch/desktop-pinned.json" --expect pinned:global --write || return 1
    ls "$scratch/desktop-home/workspaces/global/wiki" | grep -q '^packaging-'
}
check "bundle, workspace and home set: pinned to global in that home, set up on first use" bundle_pinned

# install.sh --from a release directory served over HTTP on loopback.
"$sdk_python" - "$release" >"$scratch/http.port" 2>"$logs/http.log" <<'EOF' &
import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
print(server.server_address[1], flush=True)
server.serve_forever()
EOF
server_pid=$!
for _ in $(seq 100); do [ -s "$scratch/http.port" ] && break; sleep 0.05; done
url="http://127.0.0.1:$(cat "$scratch/http.port")"
archive_install() {
    PREFIX="$scratch/prefix" PATH="$base_path" sh "$root/packaging/install.sh" --from "$url" || return 1
    "$scratch/prefix/bin/alexandria" --version && [ -x "$scratch/prefix/bin/alexandriad" ]
}
check "install.sh --from $url verifies and installs the archive" archive_install
tampered_refused() {
    local bad="$scratch/tampered"
    cp -r "$release" "$bad"
    printf 'x' >>"$bad/$(basename "$archive")"
    if PREFIX="$scratch/prefix-bad" PATH="$base_path" sh "$root/packaging/install.sh" --from "$bad" 2>"$scratch/tampered.err"; then
        echo "a tampered archive was installed"
        return 1
    fi
    cat "$scratch/tampered.err"
    grep -q "checksum mismatch" "$scratch/tampered.err" && [ ! -e "$scratch/prefix-bad/bin/alexandria" ]
}
check "install.sh refuses an archive whose checksum does not match" tampered_refused

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
