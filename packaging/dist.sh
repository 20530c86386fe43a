#!/bin/sh
# Make the release files for one target from two built binaries:
#   alexandria-<version>-<target>.tar.gz   both binaries, service templates, README, install.sh
#   alexandria-<version>-<target>.mcpb     the Claude Desktop bundle (needs the mcpb CLI)
#   SHA256SUMS                             of every file in the output directory
#
#   packaging/dist.sh --bin-dir target/release --out target/dist [--target TRIPLE] [--mcpb PATH]
#
# --target defaults to this machine's (x86_64-unknown-linux-gnu, aarch64-apple-darwin, …).
# --mcpb is the `mcpb` command of the npm package @anthropic-ai/mcpb; without it no bundle
# is made. Wheels or other files already in --out are listed in SHA256SUMS too, so the
# release workflow can gather everything into one directory and run this last.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=""
out=""
target=""
mcpb=""
while [ $# -gt 0 ]; do
    case $1 in
        --bin-dir) bin_dir=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --target) target=$2; shift 2 ;;
        --mcpb) mcpb=$2; shift 2 ;;
        *) echo "dist.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$bin_dir" ] && [ -n "$out" ] || { echo "usage: dist.sh --bin-dir DIR --out DIR [--target TRIPLE] [--mcpb PATH]" >&2; exit 2; }
for bin in alexandria alexandriad; do
    [ -x "$bin_dir/$bin" ] || { echo "dist.sh: $bin_dir/$bin is missing or not executable" >&2; exit 1; }
done
[ -n "$target" ] || target=$(sh "$repo/packaging/install.sh" --print-target)
case $target in
    *-apple-darwin) platform=darwin ;;
    *-linux-*) platform=linux ;;
    *) echo "dist.sh: unsupported target $target" >&2; exit 1 ;;
esac
version=$("$bin_dir/alexandria" --version | awk '{print $2}')
[ -n "$version" ] || { echo "dist.sh: cannot read the version from $bin_dir/alexandria --version" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
name=alexandria-$version-$target
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The archive: one top-level directory, so unpacking never spills into the current one.
stage=$work/$name
mkdir -p "$stage/bin" "$stage/share/alexandria/systemd" "$stage/share/alexandria/launchd"
install -m 0755 "$bin_dir/alexandria" "$bin_dir/alexandriad" "$stage/bin/"
install -m 0644 "$repo/packaging/systemd/alexandria.service.in" "$stage/share/alexandria/systemd/"
install -m 0644 "$repo/packaging/launchd/dev.alexandria.daemon.plist.in" "$stage/share/alexandria/launchd/"
install -m 0644 "$repo/README.md" "$stage/README.md"
install -m 0755 "$repo/packaging/install.sh" "$stage/"
cat >"$stage/INSTALL.txt" <<EOF
alexandria $version for $target

  ./install.sh                    installs bin/alexandria and bin/alexandriad into ~/.local/bin
                                  (PREFIX=/usr/local ./install.sh for /usr/local/bin)
  alexandria mcp install <client> registers the MCP server with a client
  alexandria daemon install-service
                                  optional: runs the daemon at login; it fills in
                                  share/alexandria/{systemd,launchd}/*.in with the installed paths

Man pages and shell completions are not generated yet.
EOF
# Owned by root in the archive (GNU tar on Linux, bsdtar on macOS spell it differently).
if tar --version 2>/dev/null | grep -q GNU; then
    owner="--owner=0 --group=0 --numeric-owner"
else
    owner="--uid 0 --gid 0"
fi
# shellcheck disable=SC2086
(cd "$work" && tar $owner -czf "$out/$name.tar.gz" "$name")

# The Claude Desktop bundle: manifest.json + both binaries under server/.
if [ -n "$mcpb" ]; then
    bundle=$work/bundle
    mkdir -p "$bundle/server"
    install -m 0755 "$bin_dir/alexandria" "$bin_dir/alexandriad" "$bundle/server/"
    sed -e "s/@VERSION@/$version/" -e "s/@PLATFORM@/$platform/" \
        "$repo/packaging/mcpb/manifest.json.in" >"$bundle/manifest.json"
    "$mcpb" validate "$bundle/manifest.json"
    "$mcpb" pack "$bundle" "$out/$name.mcpb"
fi

# Checksums of everything in the release directory (archives, bundles, wheels).
(cd "$out" && find . -maxdepth 1 -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort \
    | while read -r file; do
        if command -v sha256sum >/dev/null 2>&1; then sha256sum "$file"; else shasum -a 256 "$file"; fi
    done >SHA256SUMS)
echo "dist.sh: $out"
(cd "$out" && ls -l)
