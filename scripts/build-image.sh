#!/usr/bin/env bash
# Builds the container images the test node runs, as OCI image archives, without Docker or a
# registry: every layer is a deterministic tar of a staged folder, so the same inputs give the
# same digests and a rebuild with unchanged inputs reuses the cached layer.
#
#   scripts/build-image.sh [--out DIR] [--import SOCKET] [pause|moerl]...   (default: both)
#
#   pause   a static pause program (scripts/image/pause.c), the pods' sandbox image
#   moerl   the runtime image: node, dist/, production node_modules, native/build/bin/*, the
#           shared libraries they load, CA certificates, /tmp, user moerl (uid 65532); the same
#           paths, user, environment and entrypoint as the Dockerfile's runtime stage
#
# Each image is written to DIR/<name>.tar (default DIR: .moerl/images) with its reference in
# DIR/<name>.ref, and "<reference> <archive>" is printed on stdout. References are tagged by
# content (moerl:<package version>-<manifest digest prefix>), never "latest". With --import
# the archives are imported into containerd's k8s.io namespace at SOCKET (ctr from $CTR, or
# scripts/tools.sh ctr). Needs the built tree: bash scripts/setup.sh npm ts native.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

# Image names live under the reserved name "localhost" so that no reference can ever be
# resolved against a real registry: the kubelet never pulls them (IfNotPresent, pinned tags).
REPOSITORY=localhost
PAUSE_VERSION=1
APP_UID=65532

log() { echo "build-image: $*" >&2; }
die() {
  log "$*"
  exit 1
}
usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
  exit "${1:-2}"
}

out=.moerl/images
socket=""
images=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out)
      [[ $# -ge 2 ]] || usage >&2
      out="$2" && shift 2
      ;;
    --import)
      [[ $# -ge 2 ]] || usage >&2
      socket="$2" && shift 2
      ;;
    -h | --help) usage 0 ;;
    pause | moerl) images+=("$1") && shift ;;
    *) log "unknown argument '$1'" && usage >&2 ;;
  esac
done
[[ ${#images[@]} -gt 0 ]] || images=(pause moerl)
mkdir -p "$out/cache"
out="$(cd "$out" && pwd -P)"
CACHE="$out/cache"

sha256() { sha256sum "$1" | cut -d' ' -f1; }
key_of() { sha256sum | cut -c1-16; }

# Deterministic tar of a staged root: sorted names, zero times, numeric root ownership, except
# the paths in $OWNED_BY_APP (relative to the root), which belong to the app user.
tar_root() {
  local root="$1" dest="$2"
  # shellcheck disable=SC2054 # the commas belong to --pax-option's value
  local common=(--sort=name --mtime=@0 --numeric-owner --format=posix
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime)
  tar "${common[@]}" --owner=0 --group=0 -C "$root" -cf "$dest" \
    --exclude-from=<(printf '%s\n' "${OWNED_BY_APP[@]/#/./}") .
  if [[ ${#OWNED_BY_APP[@]} -gt 0 ]]; then
    tar "${common[@]}" --owner="$APP_UID" --group="$APP_UID" --no-recursion -C "$root" -rf "$dest" \
      "${OWNED_BY_APP[@]/#/./}"
  fi
}

# layer <name> <key> <populate function>: prints the path of the cached layer tar for this key
# (its digest beside it in <tar>.sha256), building it (populate fills the staging root given as
# $1) when missing. Older layers of the same name are removed, so the cache holds one per name.
layer() {
  local name="$1" key="$2" populate="$3"
  local tar="$CACHE/layer-$name-$key.tar"
  if [[ ! -f $tar ]]; then
    local stage
    stage="$(mktemp -d "$CACHE/.stage-$name-XXXXXX")"
    # shellcheck disable=SC2064 # expand now: this staging folder
    trap "rm -rf '$stage'" EXIT
    mkdir -p "$stage/root"
    "$populate" "$stage/root"
    tar_root "$stage/root" "$stage/layer.tar"
    find "$CACHE" -maxdepth 1 -name "layer-$name-*.tar*" -delete
    sha256 "$stage/layer.tar" >"$tar.sha256"
    mv "$stage/layer.tar" "$tar"
    rm -rf "$stage"
    trap - EXIT
  fi
  echo "$tar"
}

# write_image <name> <tag prefix> <config body> <layer tar>...: writes the OCI layout archive
# DIR/<name>.tar, its reference to DIR/<name>.ref, and prints "<reference> <archive>".
write_image() {
  local name="$1" prefix="$2" config_body="$3"
  shift 3
  local layout digest diff_ids="" layers="" tar
  layout="$(mktemp -d "$CACHE/.layout-$name-XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$layout'" EXIT
  mkdir -p "$layout/blobs/sha256"
  for tar in "$@"; do
    digest="$(cat "$tar.sha256")"
    ln "$tar" "$layout/blobs/sha256/$digest" 2>/dev/null || cp "$tar" "$layout/blobs/sha256/$digest"
    diff_ids+="${diff_ids:+,}\"sha256:$digest\""
    layers+="${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$digest\",\"size\":$(stat -c %s "$tar")}"
  done
  blob() { # blob <media type> <content>: stores a JSON blob, prints its descriptor
    local file="$layout/blob.tmp" d
    printf '%s' "$2" >"$file"
    d="$(sha256 "$file")"
    mv "$file" "$layout/blobs/sha256/$d"
    printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$1" "$d" "$(stat -c %s "$layout/blobs/sha256/$d")"
  }
  local config manifest manifest_digest ref
  config="$(blob application/vnd.oci.image.config.v1+json \
    "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":$config_body,\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[$diff_ids]}}")"
  manifest="$(blob application/vnd.oci.image.manifest.v1+json \
    "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":$config,\"layers\":[$layers]}")"
  manifest_digest="${manifest#*\"sha256:}"
  manifest_digest="${manifest_digest%%\"*}"
  ref="$REPOSITORY/$name:$prefix-${manifest_digest:0:12}"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
    "${manifest%\}},\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$ref\",\"org.opencontainers.image.ref.name\":\"${ref##*:}\"}}" \
    >"$layout/index.json"
  # The archive is rewritten only when its index (which names every digest) changed.
  if ! cmp -s "$layout/index.json" <(tar -xOf "$out/$name.tar" --occurrence=1 index.json 2>/dev/null); then
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$out/.$name.tar" \
      oci-layout index.json blobs
    mv "$out/.$name.tar" "$out/$name.tar"
    echo "$ref" >"$out/$name.ref"
  fi
  rm -rf "$layout"
  trap - EXIT
  echo "$ref $out/$name.tar"
}

# ---- pause ----
populate_pause() {
  gcc -static -s -O2 -Wall -Wextra -Werror -o "$1/pause" scripts/image/pause.c
}

build_pause() {
  command -v gcc >/dev/null || die "gcc is needed to build the pause image (apt-get install gcc)"
  local key tar
  key="$( (cat scripts/image/pause.c && gcc --version | head -1) | key_of)"
  OWNED_BY_APP=()
  tar="$(layer pause "$key" populate_pause)"
  write_image moerl-pause "$PAUSE_VERSION" '{"Entrypoint":["/pause"],"User":"65535:65535"}' "$tar"
}

# ---- moerl ----
NODE_MODULES_TAR="" # the production node_modules layer; elf_inputs reads its list of addons

# Production dependencies only: a copy of node_modules pruned of dev dependencies, offline.
populate_node_modules() {
  mkdir -p "$1/app"
  cp package.json package-lock.json "$1/app/"
  # Hard links: the copy costs no data, and pruning only unlinks. npm rewrites its hidden
  # lockfile, so that one is a real copy.
  cp -al node_modules "$1/app/"
  rm "$1/app/node_modules/.package-lock.json"
  cp node_modules/.package-lock.json "$1/app/node_modules/"
  (cd "$1/app" && npm prune --omit=dev --offline --no-audit --no-fund --ignore-scripts >/dev/null)
  rm "$1/app/package.json" "$1/app/package-lock.json"
  # What never runs here: type declarations, and the Temporal core's builds for other platforms
  # (five of them, ~110 MB).
  find "$1/app/node_modules" -name '*.d.ts' -type f -delete
  local releases="$1/app/node_modules/@temporalio/core-bridge/releases"
  if [[ -d $releases/x86_64-unknown-linux-gnu ]]; then
    find "$releases" -mindepth 1 -maxdepth 1 ! -name x86_64-unknown-linux-gnu -exec rm -rf {} +
  fi
}

# The ELF files of the image that load shared libraries: node, dash, the native tools and the
# native addons of the production dependencies.
elf_inputs() {
  command -v node
  command -v dash
  find native/build/bin -maxdepth 1 -type f -executable
  tar -tf "$NODE_MODULES_TAR" | grep '\.node$' | sed "s|^\./app/|$ROOT/|"
}

# Every shared library the inputs load (ldd resolves the whole closure), one resolved path a line.
library_closure() {
  local file
  while read -r file; do
    [[ -f $file ]] || continue
    ldd "$file" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' || true
    if ldd "$file" 2>/dev/null | grep -q 'not found'; then
      die "$file needs a shared library this machine does not have: $(ldd "$file" | grep 'not found' | head -1)"
    fi
  done < <(elf_inputs) | sort -u
}

# Debian's merged /usr: /lib, /lib64 and /bin are links into /usr, so a library is copied once
# under /usr and found by both the path ldd printed and the loader's default directories.
populate_base() {
  local root="$1" lib dest
  mkdir -p "$root"/usr/{bin,lib,lib64,local/bin} "$root"/etc/ssl/certs "$root/tmp" "$root/var/cache/moerl"
  ln -s usr/bin "$root/bin" && ln -s usr/lib "$root/lib" && ln -s usr/lib64 "$root/lib64"
  chmod 1777 "$root/tmp"
  while read -r lib; do
    dest="$root/usr/${lib#/usr/}"
    mkdir -p "$(dirname "$dest")"
    cp -L "$lib" "$dest"
  done < <(library_closure)
  cp -L "$(command -v node)" "$root/usr/local/bin/node"
  cp -L "$(command -v dash)" "$root/usr/bin/dash"
  ln -s dash "$root/usr/bin/sh"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nmoerl:x:%s:%s:moerl:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' \
    "$APP_UID" "$APP_UID" >"$root/etc/passwd"
  printf 'root:x:0:\nmoerl:x:%s:\nnogroup:x:65534:\n' "$APP_UID" >"$root/etc/group"
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
}

# The project's own files, rebuilt every time (small): the compiled code without its tests,
# the entry point and the native tools, at the paths the code expects (activities/native.ts).
populate_app() {
  local root="$1"
  mkdir -p "$root/app/native/build/bin"
  cp package.json "$root/app/"
  cp -a bin "$root/app/"
  cp -a dist "$root/app/dist"
  rm -rf "$root/app/dist/test"
  find native/build/bin -maxdepth 1 -type f -executable -exec cp {} "$root/app/native/build/bin/" \;
}

build_moerl() {
  [[ -d dist/activities ]] || die "dist/ is missing or incomplete: run bash scripts/setup.sh ts"
  [[ -f node_modules/.package-lock.json ]] || die "node_modules is missing: run bash scripts/setup.sh npm"
  [[ -n "$(find native/build/bin -maxdepth 1 -type f -executable 2>/dev/null)" ]] ||
    die "native/build/bin has no tools: run bash scripts/setup.sh native"
  command -v dash >/dev/null || die "dash (the image's /bin/sh) is not installed: apt-get install dash"
  local version key base_tar app_tar
  version="$(node -p 'require("./package.json").version')"
  OWNED_BY_APP=()
  key="$( (cat package-lock.json && declare -f populate_node_modules) | key_of)"
  NODE_MODULES_TAR="$(layer node-modules "$key" populate_node_modules)"
  # The base layer changes only when a binary or library it holds changes.
  key="$( (elf_inputs | xargs -r stat -L -c '%n %s %Y' && library_closure | xargs -r stat -L -c '%n %s %Y' &&
    stat -L -c '%n %s %Y' /etc/ssl/certs/ca-certificates.crt && declare -f populate_base) | key_of)"
  OWNED_BY_APP=(var/cache/moerl)
  base_tar="$(layer base "$key" populate_base)"
  OWNED_BY_APP=()
  key="$( (find dist bin native/build/bin package.json -path dist/test -prune -o -type f -print0 |
    xargs -0 stat -c '%n %s %Y' && declare -f populate_app) | key_of)"
  app_tar="$(layer app "$key" populate_app)"
  write_image moerl "$version" \
    "{\"User\":\"$APP_UID:$APP_UID\",\"WorkingDir\":\"/app\",\"Env\":[\"PATH=/usr/local/bin:/usr/bin:/bin\",\"NODE_ENV=production\",\"MOERL_NATIVE_BIN=/app/native/build/bin/\",\"MOERL_CACHE_DIR=/var/cache/moerl\"],\"Entrypoint\":[\"/usr/local/bin/node\",\"dist/workers/main.js\"]}" \
    "$base_tar" "$NODE_MODULES_TAR" "$app_tar"
}

results=()
for image in "${images[@]}"; do
  started=$SECONDS
  results+=("$("build_$image")")
  log "$image: ${results[-1]%% *} in $((SECONDS - started))s"
done

if [[ -n $socket ]]; then
  ctr="${CTR:-$(bash "$ROOT/scripts/tools.sh" ctr)}"
  for result in "${results[@]}"; do
    "$ctr" --address "$socket" --namespace k8s.io images import --local --snapshotter overlayfs "${result#* }" >&2 ||
      die "importing ${result#* } into containerd at $socket failed"
  done
fi
printf '%s\n' "${results[@]}"
