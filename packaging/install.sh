#!/bin/sh
# Build alexandria (the CLI and MCP shim) and alexandriad (the daemon) in release mode and
# install them side by side, so `alexandria` finds its daemon next to itself.
#
#   packaging/install.sh                      installs into ~/.local/bin
#   PREFIX=/usr/local packaging/install.sh    installs into /usr/local/bin
#
# Then: `alexandria mcp install <client>` and, optionally, `alexandria daemon install-service`.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${PREFIX:-${HOME:?set HOME or PREFIX}/.local}
bindir=$prefix/bin

if ! command -v cargo >/dev/null 2>&1; then
    echo "install.sh: cargo is not on PATH; install a Rust toolchain (1.88 or newer) first" >&2
    exit 1
fi

cd "$repo"
cargo build --release --locked -p alexandria -p alexandria-daemon

target=${CARGO_TARGET_DIR:-target}
case $target in
    /*) ;;
    *) target=$repo/$target ;;
esac

mkdir -p "$bindir"
for bin in alexandria alexandriad; do
    # Copy, then rename over the old binary: a running daemon keeps its (old) file and
    # nothing ever sees a half-written executable.
    install -m 0755 "$target/release/$bin" "$bindir/.$bin.new.$$"
    mv -f "$bindir/.$bin.new.$$" "$bindir/$bin"
done

echo "installed $bindir/alexandria and $bindir/alexandriad ($("$bindir/alexandria" --version))"
case ":${PATH:-}:" in
    *":$bindir:"*) ;;
    *) echo "note: $bindir is not on your PATH; add it, or call $bindir/alexandria directly" ;;
esac
echo "next: $bindir/alexandria mcp install <client>   (claude-code, claude-desktop, cursor, codex, windsurf, zed, vscode, gemini, continue)"
echo "      $bindir/alexandria daemon install-service  (optional: start the daemon at login)"
echo "a daemon that is already running keeps the old version until it restarts: alexandria daemon stop"
