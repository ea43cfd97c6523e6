#!/usr/bin/env bash
# Builds the container images the test node runs, as image archives, without Docker or a
# registry.
#
#   scripts/build-image.sh [--out DIR] [--import SOCKET] [pause|moerl|moerl-pytorch]...
#                                                           (default: pause and moerl)
#
#   pause   a static pause program (scripts/image/pause.c), the pods' sandbox image: one
#           deterministic layer, so the same inputs give the same digest
#   moerl   the Dockerfile's runtime stage, built by buildah on a base made locally
#           (scripts/image/node-base.sh: Debian bookworm and the Node.js LTS)
#   moerl-pytorch  its pytorch stage: the same plus the PyTorch trainer and its pinned torch
#           (about 7 GB: PyPI's torch wheel brings the CUDA libraries)
#
# Each image is written to DIR/<name>.tar (default DIR: .moerl/images) with its reference in
# DIR/<name>.ref, and "<reference> <archive>" is printed on stdout. References are tagged by
# content (moerl:<package version>-<image id prefix>), never "latest". After building moerl or
# moerl-pytorch, buildah's storage keeps that name's new tag alone and no image that the last
# build of either name did not use: the older tags and layers go, the layer cache of the
# next build stays (builds of the machine's buildah storage take turns). With --import the
# archives are imported into containerd's k8s.io namespace at SOCKET (ctr from $CTR, or
# scripts/tools.sh ctr). Needs root (buildah), debootstrap and the network to Debian's, npm's
# and PyPI's indexes the first time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

# Image names live under the reserved name "localhost" so that no reference can ever be
# resolved against a real registry: the kubelet never pulls them (IfNotPresent, pinned tags).
REPOSITORY=localhost
PAUSE_VERSION=1

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
    pause | moerl | moerl-pytorch) images+=("$1") && shift ;;
    *) log "unknown argument '$1'" && usage >&2 ;;
  esac
done
[[ ${#images[@]} -gt 0 ]] || images=(pause moerl)
mkdir -p "$out/cache"
out="$(cd "$out" && pwd -P)"
CACHE="$out/cache"

sha256() { sha256sum "$1" | cut -d' ' -f1; }
key_of() { sha256sum | cut -c1-16; }

# Deterministic tar of a staged root: sorted names, zero times, numeric root ownership.
tar_root() {
  # shellcheck disable=SC2054 # the commas belong to --pax-option's value
  tar --sort=name --mtime=@0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --owner=0 --group=0 -C "$1" -cf "$2" .
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
  tar="$(layer pause "$key" populate_pause)"
  write_image moerl-pause "$PAUSE_VERSION" '{"Entrypoint":["/pause"],"User":"65535:65535"}' "$tar"
}

# ---- moerl, moerl-pytorch: the Dockerfile's runtime and pytorch stages ----
# buildah builds the Dockerfile unchanged, on the local base of scripts/image/node-base.sh
# (NODE_IMAGE is its only build argument); its layer cache makes a rebuild with unchanged
# inputs a matter of seconds. RUN steps use the host's network (apt, npm and pip indexes) and
# chroot isolation, so no container network or daemon is needed.
# dockerfile_image <image name> <Dockerfile target>
dockerfile_image() {
  local name="$1" target="$2" base version id ref started
  command -v buildah >/dev/null || die "buildah is missing: bash scripts/setup.sh packages"
  base="$(bash scripts/image/node-base.sh)" || die "making the Dockerfile's base image failed"
  version="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' package.json | head -1)"
  started="$(date +%s)"
  buildah bud --isolation chroot --network host --layers --pull-never \
    --build-arg NODE_IMAGE="$base" --target "$target" --iidfile "$CACHE/$name.iid" \
    --file Dockerfile . >"$CACHE/$name-build.log" 2>&1 || {
    tail -30 "$CACHE/$name-build.log" >&2
    die "buildah could not build the Dockerfile's $target stage (log: $CACHE/$name-build.log)"
  }
  id="$(cat "$CACHE/$name.iid")"
  id="${id#sha256:}"
  ref="$REPOSITORY/$name:$version-${id:0:12}"
  buildah tag "$id" "$ref"
  # Every image of this build, each step's: the cache hits it logged and the images it made
  # (no other build runs meanwhile). The next build of this name starts from them.
  {
    sed -n -E 's/^--> Using cache ([0-9a-f]{64})$/\1/p' "$CACHE/$name-build.log"
    images_created | awk -v t="$started" '$2 >= t { print $1 }'
  } >"$CACHE/$name.images"
  prune_images "$name" "$ref" "$started"
  # The archive is rewritten only when the image changed; the old one goes first (7 GB for
  # moerl-pytorch: the disk need not hold both).
  if [[ "$(cat "$out/$name.ref" 2>/dev/null)" != "$ref" || ! -f "$out/$name.tar" ]]; then
    rm -f "$out/.$name.tar" "$out/$name.tar" "$out/$name.ref"
    buildah push --quiet "$ref" "docker-archive:$out/.$name.tar:$ref" >&2
    mv "$out/.$name.tar" "$out/$name.tar"
    echo "$ref" >"$out/$name.ref"
  fi
  echo "$ref $out/$name.tar"
}

# images_created: "<image id> <created, epoch seconds>" for every image in buildah's storage.
images_created() {
  local image_id created
  buildah images --all --no-trunc --format '{{.ID}}|{{.CreatedAtRaw}}' | while IFS='|' read -r image_id created; do
    echo "${image_id#sha256:} $(date -d "${created% UTC}" +%s)"
  done
}

# prune_images <name> <reference> <build start, epoch seconds>: removes the other tags of
# $REPOSITORY/<name>, then every untagged image that no recorded build (DIR/cache/*.images)
# used and that is older than this build (another checkout's build may be under way).
prune_images() {
  local name="$1" keep_ref="$2" started="$3" line image_id created tag before after
  before="$(buildah images --all -q | wc -l)"
  while read -r tag; do
    [[ $tag == "$keep_ref" ]] || buildah rmi "$tag" >/dev/null 2>&1 || true
  done < <(buildah images --format '{{.Name}}:{{.Tag}}' | grep -F "$REPOSITORY/$name:" || true)
  local kept=()
  mapfile -t kept < <(cat "$CACHE"/*.images 2>/dev/null)
  # An intermediate image is dangling once the images made from it are gone: pass after pass.
  local dangling=() removed=1
  while [[ $removed -gt 0 ]]; do
    removed=0
    mapfile -t dangling < <(buildah images --all --filter dangling=true --no-trunc -q)
    while read -r image_id created; do
      [[ $created -lt $started && " ${dangling[*]} " == *" sha256:$image_id "* ]] || continue
      for line in "${kept[@]}"; do [[ $image_id == "$line" ]] && continue 2; done
      buildah rmi "$image_id" >/dev/null 2>&1 && removed=$((removed + 1)) # not when in use
    done < <(images_created)
  done
  after="$(buildah images --all -q | wc -l)"
  [[ $after -eq $before ]] || log "$name: $((before - after)) older image(s) removed from buildah's storage"
}

build_moerl() { dockerfile_image moerl runtime; }
build_moerl-pytorch() { dockerfile_image moerl-pytorch pytorch; }

# One buildah build at a time on this machine: a build's pruning must not remove what another
# uses. The pause image needs no buildah, so a test node's start never waits behind a long build.
locked=0
buildah_lock() {
  [[ $locked -eq 1 ]] && return
  exec 9>"${TMPDIR:-/tmp}/moerl-build-image.lock"
  flock 9
  locked=1
}

# An image this run of scripts/test.sh has built already (it lists them in MOERL_IMAGES_BUILT):
# its last result, without buildah, while the run builds another image.
last_build() {
  local name="$1" ref
  ref="$(cat "$out/$name.ref" 2>/dev/null)" && [[ -f $out/$name.tar ]] ||
    die "MOERL_IMAGES_BUILT names $name, but $out has no $name.ref and $name.tar"
  echo "$ref $out/$name.tar"
}

results=()
for image in "${images[@]}"; do
  started=$SECONDS
  if [[ " ${MOERL_IMAGES_BUILT:-} " == *" $image "* ]]; then
    results+=("$(last_build "$image")")
    continue
  fi
  [[ $image == pause ]] || buildah_lock
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
