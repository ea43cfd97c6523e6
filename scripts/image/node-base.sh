#!/usr/bin/env bash
# Makes the Dockerfile's base images locally, for a machine that cannot pull from a registry:
# Debian bookworm from debootstrap plus the official Node.js binaries of one release, laid out as
# the public node image lays them out (/usr/local/bin/node, npm and npx from
# /usr/local/lib/node_modules). Both of the Dockerfile's bases come from it:
#
#   localhost/node:<version>-bookworm        (for `FROM ${NODE_IMAGE}`)
#   localhost/node:<version>-bookworm-slim   (for `FROM ${NODE_IMAGE}-slim`)
#
# They are one image under two names: the public "bookworm" variant also carries compilers and
# version-control tools, which no stage of the Dockerfile relies on (each installs what it uses).
#
#   scripts/image/node-base.sh            prints the NODE_IMAGE build argument, e.g.
#                                         localhost/node:24.19.0-bookworm
#
# Node is scripts/node-lts.sh's release (the official linux-x64 binaries). The root filesystem
# is made once and kept as a tar in the tools cache, keyed by BASE_REVISION, the Node version,
# the mirror and the added CA certificates; the image is committed into buildah's storage only
# when that storage does not hold it under the same key (and then with a fixed timestamp, so
# the same root filesystem gives the same image and the Dockerfile's cached layers stay valid). Debian packages come from the
# host's own bookworm mirror (apt's configuration), CA certificates the host added under
# /usr/local/share/ca-certificates are added to the image's trust store, and the host's npm and
# pip index settings are kept in the image's npmrc and pip.conf, so that a build behind a mirror
# or a TLS-inspecting proxy works as the host does. Needs root, debootstrap and buildah.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
node="$(bash "$ROOT/scripts/node-lts.sh")"
node_home="$(dirname "$(dirname "$node")")"
NODE_VERSION="$("$node" --version)"
NODE_VERSION="${NODE_VERSION#v}"
SUITE=bookworm
# Raise when make_rootfs below changes what it makes: the key then changes and the base (and
# every layer built on it) is made again.
BASE_REVISION=1
REFERENCE="localhost/node:$NODE_VERSION-$SUITE"

log() { echo "node-base: $*" >&2; }
die() {
  log "$*"
  exit 1
}
for tool in debootstrap buildah; do
  command -v "$tool" >/dev/null || die "$tool is missing: bash scripts/setup.sh packages"
done

# The host's mirror of the suite's main archive, as apt resolves it.
mirror="$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
  | awk -v suite="$SUITE" '$2 == suite { print $1; exit }')"
mirror="${mirror:-http://deb.debian.org/debian/}"
security_mirror="$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
  | awk -v suite="$SUITE-security" '$2 == suite { print $1; exit }')"
security_mirror="${security_mirror:-http://deb.debian.org/debian-security/}"

cache="${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/moerl/tools}"
key="$( (echo "$BASE_REVISION $NODE_VERSION $mirror $security_mirror" \
  && cat /usr/local/share/ca-certificates/*.crt 2>/dev/null) | sha256sum | cut -c1-12)"
dir="$cache/node-base-$NODE_VERSION-$key"
rootfs_tar="$dir/rootfs.tar"

# The images carry the key as a label: a changed script, mirror or CA set makes them again.
built_key() { buildah inspect --type image --format '{{index .OCIv1.Config.Labels "dev.moerl.node-base"}}' "$1" 2>/dev/null; }
if [[ "$(built_key "$REFERENCE")" == "$key" && "$(built_key "$REFERENCE-slim")" == "$key" ]]; then
  echo "$REFERENCE"
  exit 0
fi

make_rootfs() {
  local work="$dir/work" rootfs="$dir/work/rootfs"
  rm -rf "$work" && mkdir -p "$work"
  log "debootstrap $SUITE from $mirror (a few minutes)"
  debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    die "debootstrap failed (log: $work/debootstrap.log)"
  }
  cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $security_mirror $SUITE-security main
EOF
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >"$work/update-ca-certificates.log" 2>&1
  fi

  log "Node.js $NODE_VERSION (scripts/node-lts.sh)"
  install -m 0755 "$node_home/bin/node" "$rootfs/usr/local/bin/node"
  mkdir -p "$rootfs/usr/local/lib" "$rootfs/usr/local/include"
  cp -a "$node_home/lib/node_modules" "$rootfs/usr/local/lib/"
  cp -a "$node_home/include/node" "$rootfs/usr/local/include/"
  cp -a "$node_home/bin/npm" "$node_home/bin/npx" "$rootfs/usr/local/bin/"

  # The host's package indexes and trust store, for the RUN steps of a build.
  mkdir -p "$rootfs/usr/local/etc"
  {
    echo "cafile=/etc/ssl/certs/ca-certificates.crt"
    echo "registry=$(npm config get registry 2>/dev/null || echo https://registry.npmjs.org/)"
    echo "update-notifier=false"
  } >"$rootfs/usr/local/etc/npmrc"
  {
    echo "[global]"
    echo "cert = /etc/ssl/certs/ca-certificates.crt"
    local index
    index="$(python3 -m pip config get global.index-url 2>/dev/null || true)"
    [[ -z "$index" ]] || echo "index-url = $index"
  } >"$rootfs/etc/pip.conf"

  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar --numeric-owner -C "$rootfs" -cf "$rootfs_tar.partial" .
  mv "$rootfs_tar.partial" "$rootfs_tar"
  rm -rf "$work"
  # Earlier bases (another key) are not used again.
  find "$cache" -mindepth 1 -maxdepth 1 -name 'node-base-*' ! -name "$(basename "$dir")" -exec rm -rf {} +
}

[[ -f "$rootfs_tar" ]] || make_rootfs

log "committing $REFERENCE into buildah's storage"
container="$(buildah from scratch)"
trap 'buildah rm "$container" >/dev/null 2>&1 || true' EXIT
mountpoint="$(buildah mount "$container")"
tar --numeric-owner -C "$mountpoint" -xf "$rootfs_tar"
buildah umount "$container" >/dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env NODE_VERSION="$NODE_VERSION" --cmd node --label "dev.moerl.node-base=$key" "$container"
buildah commit --quiet --timestamp 0 "$container" "$REFERENCE" >/dev/null
buildah tag "$REFERENCE" "$REFERENCE-slim"
echo "$REFERENCE"
