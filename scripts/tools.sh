#!/usr/bin/env bash
# Resolves the external binaries moerl runs and prints the absolute path of a usable one on
# stdout (for cni-plugins: a folder of CNI plugin binaries). Diagnostics go to stderr.
#
#   scripts/tools.sh <name>
#   scripts/tools.sh --clean-go-caches
#
#   temporal versitygw                      Temporal CLI dev server, S3 gateway
#   temporal-server temporal-sql-tool       the Temporal server and its SQL schema tool (a cluster)
#   temporal-server-schema                  (a folder) the server's PostgreSQL schemas
#   kube-apiserver kube-controller-manager  a Kubernetes control plane and node ...
#   kube-scheduler kubelet kubectl          ... (one build: all five)
#   etcd kwok                               its store; fake nodes for the control-plane tests
#   containerd ctr cni-plugins coredns      a real node's runtime (one build: containerd, ctr and
#                                           containerd-shim-runc-v2), pod network plugins
#                                           (bridge loopback host-local portmap), cluster DNS
#   kueue                                   Kueue's controller manager (its CRDs beside it, in
#                                           kueue-crds/), the job queue of the queueing tests
#   prometheus                              a Prometheus server without service discovery
#                                           (static targets), for the opt-in scrape test
#   keda-crds                               KEDA's CustomResourceDefinitions, eventing's too (a
#                                           folder; nothing is built), for the autoscaling tests
#   keda-operator keda-adapter              KEDA's operator and its metrics API server (one
#                                           build, with the triggers scripts/kube-tools/keda/
#                                           triggers lists), for the autoscaling test
#
# Order: the override variable (the name upper-cased with - as _, plus _PATH: KUBELET_PATH,
# KUBE_APISERVER_PATH, ...; but TEMPORAL_CLI_PATH, and CNI_PLUGINS_DIR for the folder), then
# for temporal and versitygw a binary on PATH, then the tools cache, which is filled by
# building the pinned Go modules when missing. The Kubernetes and node tools skip PATH: the
# kubectl, etcd or containerd found there (a cloud SDK's, a distribution's) is usually another
# version than the one the tests and the other components are pinned to. The cache lives outside the
# repository so clones and `git clean` keep it:
#   ${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/moerl/tools}/<build>-<version>/<name>
# The builds download modules and compile into Go caches of their own in that folder (go-caches/),
# which the builds of one set-up run share; --clean-go-caches removes them (scripts/setup.sh does,
# after its tool steps): after every Kubernetes-side build they hold about 19 GB, and the tests
# need that disk (the PyTorch node test's image import alone takes 13 GB at its peak).
set -euo pipefail

# Pinned versions: the only place they are written down. temporal v1.5.1 is the newest CLI
# tag without replace directives in its go.mod, i.e. the newest one `go install` accepts.
TEMPORAL_VERSION=v1.5.1
# The server the CLI's dev server embeds (the go.temporal.io/server of v1.5.1's go.mod), so
# that the cluster tests and the dev server run the same server code.
TEMPORAL_SERVER_VERSION=v1.29.1
VERSITYGW_VERSION=v1.7.0
KWOK_VERSION=v0.8.0
CONTAINERD_VERSION=v2.4.2
CNI_PLUGINS_VERSION=v1.10.0
# Kueue's own go.mod pins its k8s.io modules (v0.35, one minor below the test cluster's API
# server: within client skew); it has no replace directives, so `go install` builds it.
KUEUE_VERSION=v0.17.0
# Prometheus 3's Go module versions are v0.3MM.P for v3.MM.P: v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_VERSION=v0.316.0
# Kubernetes and etcd replace their own sub-modules with local paths, so `go install` refuses
# them; they are built from wrapper modules whose go.mod (with go.sum) pins them instead:
# k8s.io/kubernetes in scripts/kube-tools/kubernetes/go.mod, which also replaces each staging
# module (k8s.io/api, ...) by its published v0.<minor>.<patch>; go.etcd.io/etcd/server/v3 in
# scripts/kube-tools/etcd/go.mod. CoreDNS is built from scripts/kube-tools/coredns, whose main
# imports only the plugins the test node uses and whose go.mod pins github.com/coredns/coredns.
# KEDA's go.mod carries a replace directive, which binds only
# its own builds: scripts/kube-tools/keda/go.mod repeats it beside the pin of the KEDA release
# k8s/autoscaling is written for (its CRDs, operator and metrics server); the operator and
# metrics server are built from a copy of KEDA with the other triggers' scalers left out.
KUBE_TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/kube-tools"

KUBERNETES_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
CNI_PLUGINS=(main/bridge main/loopback ipam/host-local meta/portmap)

log() { echo "tools.sh: $*" >&2; }
die() {
  log "$*"
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

# The build (a cache folder) that provides a tool, and the files that build must produce.
build_of() {
  case "$1" in
    temporal | versitygw | kwok | etcd | coredns | kueue | prometheus | keda-crds) echo "$1" ;;
    temporal-server | temporal-sql-tool | temporal-server-schema) echo temporal-server ;;
    kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kubectl) echo kubernetes ;;
    containerd | ctr) echo containerd ;;
    keda-operator | keda-adapter) echo keda ;;
    cni-plugins) echo cni-plugins ;;
    *) usage ;;
  esac
}

build_outputs() {
  case "$1" in
    kubernetes) echo "${KUBERNETES_COMMANDS[*]}" ;;
    containerd) echo containerd ctr containerd-shim-runc-v2 ;;
    cni-plugins) basename -a "${CNI_PLUGINS[@]}" | tr '\n' ' ' ;;
    kueue) echo kueue kueue-crds ;;
    temporal-server) echo temporal-server temporal-sql-tool temporal-server-schema ;;
    keda-crds) echo crd-bases ;;
    keda) echo keda-operator keda-adapter ;;
    *) echo "$1" ;;
  esac
}

override_var() {
  case "$1" in
    temporal) echo TEMPORAL_CLI_PATH ;;
    cni-plugins) echo CNI_PLUGINS_DIR ;;
    *) echo "$1" | tr 'a-z-' 'A-Z_' | sed 's/$/_PATH/' ;;
  esac
}

# The version a wrapper module requires of <module> (read from its go.mod, the one place it is
# pinned), so that finding a cached build needs neither Go nor the network.
wrapper_version() {
  local dir="$KUBE_TOOLS_DIR/$1" module="$2" version
  version="$(awk -v m="$module" '$1 == m && $2 ~ /^v/ { print $2; exit }
    $1 == "require" && $2 == m { print $3; exit }' "$dir/go.mod" 2>/dev/null)"
  [[ -n "$version" ]] || die "$dir/go.mod does not require $module."
  echo "$version"
}

# The first 8 hex digits of the sha256 of a wrapper module's files.
wrapper_digest() { cat "$KUBE_TOOLS_DIR/$1"/* | sha256sum | cut -c1-8; }

build_version() {
  case "$1" in
    temporal) echo "$TEMPORAL_VERSION" ;;
    temporal-server) echo "$TEMPORAL_SERVER_VERSION" ;;
    versitygw) echo "$VERSITYGW_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    containerd) echo "$CONTAINERD_VERSION" ;;
    cni-plugins) echo "$CNI_PLUGINS_VERSION" ;;
    kueue) echo "$KUEUE_VERSION" ;;
    prometheus) echo "$PROMETHEUS_VERSION" ;;
    keda-crds) wrapper_version keda github.com/kedacore/keda/v2 ;;
    # The triggers kept are part of what the build is (keda_source).
    keda) echo "$(wrapper_version keda github.com/kedacore/keda/v2)-$(wrapper_digest keda)" ;;
    kubernetes) wrapper_version kubernetes k8s.io/kubernetes ;;
    etcd) wrapper_version etcd go.etcd.io/etcd/server/v3 ;;
    # The main of ours is part of what the build is: its digest names the build too.
    coredns) echo "$(wrapper_version coredns github.com/coredns/coredns)-$(wrapper_digest coredns)" ;;
  esac
}

# go_command <build> <version> <output dir>: the go command line that writes the build's
# binaries into <output dir>, one per line (so that paths with spaces survive).
go_command() {
  local build="$1" version="$2" out="$3" pkgs=() p
  case "$build" in
    temporal) printf '%s\n' install "github.com/temporalio/cli/cmd/temporal@$version" ;;
    temporal-server)
      printf '%s\n' install -trimpath '-ldflags=-s -w' \
        "go.temporal.io/server/cmd/server@$version" "go.temporal.io/server/cmd/tools/sql@$version"
      ;;
    versitygw) printf '%s\n' install "github.com/versity/versitygw/cmd/versitygw@$version" ;;
    kwok) printf '%s\n' install -trimpath '-ldflags=-s -w' "sigs.k8s.io/kwok/cmd/kwok@$version" ;;
    kueue)
      printf '%s\n' install -trimpath \
        "-ldflags=-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version -X sigs.k8s.io/kueue/pkg/version.GitCommit=" \
        "sigs.k8s.io/kueue/cmd/kueue@$version"
      ;;
    prometheus)
      # remove_all_sd leaves out every service-discovery plugin (the cloud SDKs are most of the
      # build); static_configs, all a test on 127.0.0.1 needs, remain. The web UI's assets are
      # not embedded (no builtinassets tag): the HTTP API is complete without them.
      local v="${version#v0.}"
      printf '%s\n' install -trimpath -tags=remove_all_sd \
        "-ldflags=-s -w -X github.com/prometheus/common/version.Version=3.$((10#${v%%.*} - 300)).${v#*.}" \
        "github.com/prometheus/prometheus/cmd/prometheus@$version"
      ;;
    containerd)
      # Without cgo the btrfs, devmapper and zfs snapshotters cannot work; the tags leave
      # them out (overlayfs and native remain), and the CLI's man-page generator with them.
      # The runc shim is what containerd starts per pod; runc itself needs cgo (Debian: runc).
      for p in containerd ctr containerd-shim-runc-v2; do
        pkgs+=("github.com/containerd/containerd/v2/cmd/$p@$version")
      done
      printf '%s\n' install -trimpath -tags=no_btrfs,no_devmapper,no_zfs,urfave_cli_no_docs \
        "-ldflags=-s -w -X github.com/containerd/containerd/v2/version.Version=$version" "${pkgs[@]}"
      ;;
    cni-plugins)
      for p in "${CNI_PLUGINS[@]}"; do pkgs+=("github.com/containernetworking/plugins/plugins/$p@$version"); done
      printf '%s\n' install -trimpath \
        "-ldflags=-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$version" \
        "${pkgs[@]}"
      ;;
    kubernetes)
      # The version variables the release build sets (hack/lib/version.sh): the apiserver's
      # /version, kubectl's skew check and the kubelet's node status report them. The commit
      # is not known from the module, so it is left empty rather than a placeholder.
      local minor="${version#v1.}" ldflags="-s -w" v
      minor="${minor%%.*}"
      for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitCommit= -X $v.gitTreeState=clean"
      done
      for p in "${KUBERNETES_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$p"); done
      printf '%s\n' build -trimpath "-ldflags=$ldflags" -o "$out/" "${pkgs[@]}"
      ;;
    etcd) printf '%s\n' build -trimpath '-ldflags=-s -w' -o "$out/etcd" go.etcd.io/etcd/server/v3 ;;
    # CoreDNS's packages with a main of ours that imports only the plugins the tests use.
    coredns) printf '%s\n' build -trimpath '-ldflags=-s -w' -o "$out/coredns" . ;;
    keda)
      # From keda_source's pruned copy. One go build, so the packages both share compile once.
      local release="${version%%-*}"
      local ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${release#v} -X github.com/kedacore/keda/v2/version.GitCommit="
      printf '%s\n' build -trimpath "-ldflags=$ldflags" -o "$out/" \
        github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter
      ;;
    # Only the module's source: its CRDs are copied out below (copy_module_files).
    keda-crds) printf '%s\n' mod download "github.com/kedacore/keda/v2@$version" ;;
  esac
}

tools_dir() {
  local base="${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/moerl/tools}"
  mkdir -p "$base"
  (cd "$base" && pwd -P)
}

go_caches_dir() { echo "$(tools_dir)/go-caches"; }

# The module cache is read-only by design: go clean empties it.
clean_go_caches() {
  local dir
  dir="$(go_caches_dir)"
  [[ -d $dir ]] || return 0
  if [[ -d $dir/mod ]] && command -v go >/dev/null 2>&1; then
    GOMODCACHE="$dir/mod" GOWORK=off go clean -modcache
  fi
  chmod -R u+w "$dir" 2>/dev/null || true
  rm -rf "$dir"
  log "removed the tool builds' Go caches ($dir)"
}

# module_dir <module@version> <folder outside any module>: downloads the module into the module
# cache and prints its folder there (read-only). Run from outside any module, the download
# touches no go.mod.
module_dir() {
  (cd "$2" && GOWORK=off go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

# keda_source <version> <dir>: a module in <dir> that builds KEDA <version> with only the
# triggers scripts/kube-tools/keda/triggers lists: the wrapper's go.mod and go.sum, replacing
# KEDA by a writable copy in <dir>/keda without the other triggers' scalers. KEDA has no build
# tags to leave a scaler out, and each brings its service's SDK: most of a full build's time.
keda_source() {
  local version="$1" dir="$2" module builder kept constructors=() file name
  module="$(module_dir "github.com/kedacore/keda/v2@$version" "$(dirname "$dir")")"
  [[ -d $module/pkg/scalers ]] || die "the github.com/kedacore/keda/v2@$version module has no pkg/scalers."
  mkdir -p "$dir"
  cp "$KUBE_TOOLS_DIR/keda/go.mod" "$KUBE_TOOLS_DIR/keda/go.sum" "$dir/"
  cp -r "$module" "$dir/keda"
  chmod -R u+w "$dir/keda"
  kept="$(grep -v '^#' "$KUBE_TOOLS_DIR/keda/triggers" | tr '\n' ' ')"
  # buildScaler's switch, between KEDA's TRIGGERS-START and TRIGGERS-END markers: each case is
  # one line and its return the next; the cases of other triggers go.
  builder="$dir/keda/pkg/scaling/scalers_builder.go"
  awk -v kept=" $kept" '
    /TRIGGERS-START/ { inside = 1; print; next }
    /TRIGGERS-END/ { inside = 0 }
    inside && /^\t\/\// { next }
    inside && /^\tcase "/ { split($0, q, "\""); drop = index(kept, " " q[2] " ") == 0 }
    inside && drop { if ($0 ~ /^\t\treturn/) drop = 0; next }
    { print }' "$builder" >"$builder.kept"
  mv "$builder.kept" "$builder"
  for name in $kept; do
    grep -qF "case \"$name\":" "$builder" || die "KEDA $version has no trigger '$name' (scripts/kube-tools/keda/triggers)."
  done
  mapfile -t constructors < <(grep -o 'scalers\.New[A-Za-z0-9]*' "$builder" | sed 's/^scalers\.//' | sort -u)
  for file in "$dir/keda/pkg/scalers/"*_scaler.go; do
    for name in "${constructors[@]}"; do grep -q "^func $name(" "$file" && continue 2; done
    rm "$file"
  done
  # The one declaration the kept scalers use from a file that went (azure_queue_scaler.go).
  printf 'package scalers\n\nconst externalMetricType = "External"\n' >"$dir/keda/pkg/scalers/external_metric_type.go"
  (cd "$dir" && GOWORK=off go mod edit -replace github.com/kedacore/keda/v2=./keda)
}

# Prints the absolute path of an executable file, or fails.
absolute_executable() {
  local path="$1"
  [[ -f "$path" && -x "$path" ]] || return 1
  echo "$(cd "$(dirname "$path")" && pwd -P)/$(basename "$path")"
}

build_complete() {
  local dir="$1" out
  for out in $(build_outputs "$2"); do [[ -x "$dir/$out" ]] || return 1; done
}

# build_with_go <tool> <build> <version> <final dir> <override variable>: builds into a
# temporary directory beside the final one and renames it into place, so an interrupted build
# never leaves a half-written binary where the next run would pick it up.
build_with_go() {
  local name="$1" build="$2" version="$3" final_dir="$4" override_var="$5"
  if ! command -v go >/dev/null 2>&1; then
    die "no $name binary found and Go is not installed to build one.
  Either install Go (https://go.dev/dl/, 1.26 or newer) and run this again,
  or put a $name binary on PATH, or set $override_var=/path/to/$name."
  fi
  local parent tmp started go_pid workdir=. args=()
  parent="$(dirname "$final_dir")"
  # Exported: copy_module_files reads the same module cache.
  export GOCACHE GOMODCACHE
  GOCACHE="$(go_caches_dir)/build"
  GOMODCACHE="$(go_caches_dir)/mod"
  # Leftovers of builds killed with SIGKILL a day or more ago.
  find "$parent" -maxdepth 1 -name ".build-$build-*" -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
  tmp="$(mktemp -d "$parent/.build-$build-XXXXXX")"
  chmod 755 "$tmp"
  mapfile -t args < <(go_command "$build" "$version" "$tmp")
  [[ "$build" == kubernetes || "$build" == etcd || "$build" == coredns ]] && workdir="$KUBE_TOOLS_DIR/$build"
  # Outside any module: a download must not touch a go.mod.
  [[ "$build" == keda-crds ]] && workdir="$tmp"
  started=$SECONDS
  log "building $build $version from Go modules into $final_dir (takes a few minutes once)"
  if [[ "$build" == keda ]]; then
    workdir="$tmp/source"
    # shellcheck disable=SC2064
    trap "chmod -R u+w '$tmp'; rm -rf '$tmp'" EXIT
    keda_source "${version%%-*}" "$workdir"
  fi
  # go runs in its own process group so that an interrupted build stops go and the compiler
  # and linker under it; otherwise they would finish and recreate the temporary folder.
  # GOWORK=off: a go.work above the wrapper modules must not change what they build.
  local setsid=()
  command -v setsid >/dev/null 2>&1 && setsid=(setsid)
  # GOGC=400 (unless set): the compiler and linker collect garbage a quarter as often; a kwok
  # build from empty caches took 21 % less CPU and 19 % less time (324 s against 409 s of CPU,
  # 171 s against 211 s), at most 1 GB for one compiler process. -dwarf=false: the compiler
  # writes no debug information, which nothing here reads (panics' stacks do not need it): the
  # KEDA build from an empty build cache took 8 % less CPU (408 s against 444 s).
  (cd "$workdir" && CGO_ENABLED=0 GOWORK=off GOGC="${GOGC:-400}" GOFLAGS="${GOFLAGS:+$GOFLAGS }-gcflags=all=-dwarf=false" \
    GOBIN="$tmp" exec "${setsid[@]}" go "${args[@]}") >&2 &
  go_pid=$!
  # shellcheck disable=SC2064 # expand now: the traps act on this build's process and folder
  trap "kill -TERM -- -$go_pid $go_pid 2>/dev/null; wait $go_pid; rm -rf '$tmp'; exit 143" TERM INT HUP
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  if ! wait "$go_pid"; then
    die "building $build $version failed (see the go output above)."
  fi
  trap - TERM INT HUP
  if [[ "$build" == temporal-server ]]; then
    mv "$tmp/server" "$tmp/temporal-server" && mv "$tmp/sql" "$tmp/temporal-sql-tool"
    copy_module_files "go.temporal.io/server@$version" schema/postgresql/v12 '*' "$tmp/temporal-server-schema"
  fi
  if [[ "$build" == kueue ]]; then
    copy_module_files "sigs.k8s.io/kueue@$version" config/components/crd/bases '*.yaml' "$tmp/kueue-crds"
  fi
  if [[ "$build" == keda ]]; then
    mv "$tmp/operator" "$tmp/keda-operator" && mv "$tmp/adapter" "$tmp/keda-adapter"
    rm -rf "$tmp/source"
  fi
  if [[ "$build" == keda-crds ]]; then
    # Every one: the operator's manager exits when a kind it watches (the eventing.keda.sh ones
    # too) is not served for two minutes.
    copy_module_files "github.com/kedacore/keda/v2@$version" config/crd/bases '*.yaml' "$tmp/crd-bases"
  fi
  build_complete "$tmp" "$build" || die "go finished but did not produce all of: $(build_outputs "$build") (in $tmp)."
  # Another process may have finished the same build meanwhile; its binaries are as good.
  if ! build_complete "$final_dir" "$build"; then
    rm -rf "$final_dir"
    mv "$tmp" "$final_dir" || build_complete "$final_dir" "$build" || die "could not move the build into $final_dir."
  fi
  rm -rf "$tmp"
  trap - EXIT
  log "built $build $version in $((SECONDS - started))s"
}

# copy_module_files <module@version> <folder in it> <file glob> <destination>: files of a module
# `go` just fetched (CustomResourceDefinitions, SQL schemas), kept in the tools cache so a cached
# build needs neither the module cache nor the network. Folders come whole, made writable (the
# module cache is read-only) so that a later build can replace them.
copy_module_files() {
  local dir
  dir="$(module_dir "$1" "$(dirname "$4")")"
  [[ -d "$dir/$2" ]] || die "the $1 module has no $2."
  mkdir -p "$4"
  # shellcheck disable=SC2086 # the glob is meant to expand here
  cp -r "$dir/$2"/$3 "$4/"
  chmod -R u+w "$4"
}

resolve() {
  local name="$1" build version override_var
  build="$(build_of "$name")"
  override_var="$(override_var "$name")"

  local override="${!override_var:-}"
  if [[ -n "$override" ]]; then
    if [[ "$name" == cni-plugins || "$name" == keda-crds || "$name" == temporal-server-schema ]]; then
      [[ -d "$override" ]] || die "$override_var=$override is not a folder."
      (cd "$override" && pwd -P)
    else
      absolute_executable "$override" || die "$override_var=$override is not an executable file."
    fi
    return
  fi

  local on_path
  if [[ "$name" == temporal || "$name" == versitygw ]] && on_path="$(command -v "$name" 2>/dev/null)" &&
    [[ -n "$on_path" ]]; then
    absolute_executable "$on_path" && return
  fi

  local final_dir
  version="$(build_version "$build")"
  final_dir="$(tools_dir)/$build-$version"
  build_complete "$final_dir" "$build" || build_with_go "$name" "$build" "$version" "$final_dir" "$override_var"
  if [[ "$name" == cni-plugins ]]; then
    echo "$final_dir"
  elif [[ "$name" == keda-crds ]]; then
    echo "$final_dir/crd-bases"
  elif [[ "$name" == temporal-server-schema ]]; then
    echo "$final_dir/temporal-server-schema"
  else
    absolute_executable "$final_dir/$name"
  fi
}

[[ $# -eq 1 ]] || usage
if [[ $1 == --clean-go-caches ]]; then
  clean_go_caches
else
  resolve "$1"
fi
