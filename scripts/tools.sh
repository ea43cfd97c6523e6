#!/usr/bin/env bash
# Resolves the external server binaries moerl runs (Temporal CLI dev server, versitygw S3
# gateway) and prints the absolute path of a usable one on stdout. Diagnostics go to stderr.
#
#   scripts/tools.sh temporal     scripts/tools.sh versitygw
#
# Order: the override variable (TEMPORAL_CLI_PATH / VERSITYGW_PATH), then a binary on PATH,
# then the tools cache, which is filled by building the pinned Go module when it is missing.
# The cache lives outside the repository so clones and `git clean` keep it:
#   ${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/moerl/tools}/<name>-<version>/<name>
set -euo pipefail

# Pinned versions: the only place they are written down. temporal v1.5.1 is the newest CLI
# tag without replace directives in its go.mod, i.e. the newest one `go install` accepts.
TEMPORAL_VERSION=v1.5.1
TEMPORAL_MODULE=github.com/temporalio/cli/cmd/temporal
VERSITYGW_VERSION=v1.7.0
VERSITYGW_MODULE=github.com/versity/versitygw/cmd/versitygw

log() { echo "tools.sh: $*" >&2; }
die() {
  log "$*"
  exit 1
}

usage() {
  echo "usage: scripts/tools.sh <temporal|versitygw>" >&2
  exit 2
}

tools_dir() {
  local base="${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/moerl/tools}"
  mkdir -p "$base"
  (cd "$base" && pwd -P)
}

# Prints the absolute path of an executable file, or fails.
absolute_executable() {
  local path="$1"
  [[ -f "$path" && -x "$path" ]] || return 1
  echo "$(cd "$(dirname "$path")" && pwd -P)/$(basename "$path")"
}

# build_with_go <name> <module> <version> <final dir>: installs into a temporary directory
# beside the final one and renames it into place, so an interrupted build never leaves a
# half-written binary where the next run would pick it up.
build_with_go() {
  local name="$1" module="$2" version="$3" final_dir="$4"
  local override_var="$5"
  if ! command -v go >/dev/null 2>&1; then
    die "no $name binary found and Go is not installed to build one.
  Either install Go (https://go.dev/dl/, 1.25 or newer) and run this again,
  or put a $name binary on PATH, or set $override_var=/path/to/$name."
  fi
  local parent tmp started go_pid
  parent="$(dirname "$final_dir")"
  # Leftovers of builds killed with SIGKILL a day or more ago.
  find "$parent" -maxdepth 1 -name ".build-$name-*" -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
  tmp="$(mktemp -d "$parent/.build-$name-XXXXXX")"
  chmod 755 "$tmp"
  started=$SECONDS
  log "building $name $version from Go modules into $final_dir (takes a few minutes once)"
  # go runs in its own process group so that an interrupted build stops go and the compiler
  # and linker under it; otherwise they would finish and recreate the temporary folder.
  if command -v setsid >/dev/null 2>&1; then
    CGO_ENABLED=0 GOBIN="$tmp" setsid go install "$module@$version" >&2 &
  else
    CGO_ENABLED=0 GOBIN="$tmp" go install "$module@$version" >&2 &
  fi
  go_pid=$!
  # shellcheck disable=SC2064 # expand now: the traps act on this build's process and folder
  trap "kill -TERM -- -$go_pid $go_pid 2>/dev/null; wait $go_pid; rm -rf '$tmp'; exit 143" TERM INT HUP
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  if ! wait "$go_pid"; then
    die "building $name $version failed (see the go output above)."
  fi
  trap - TERM INT HUP
  [[ -x "$tmp/$name" ]] || die "go install finished but produced no $tmp/$name."
  # Another process may have finished the same build meanwhile; its binary is as good.
  if [[ ! -x "$final_dir/$name" ]]; then
    rm -rf "$final_dir"
    mv "$tmp" "$final_dir" || [[ -x "$final_dir/$name" ]] || die "could not move the build into $final_dir."
  fi
  rm -rf "$tmp"
  trap - EXIT
  log "built $name $version in $((SECONDS - started))s"
}

resolve() {
  local name="$1" version module override_var
  case "$name" in
    temporal)
      version=$TEMPORAL_VERSION module=$TEMPORAL_MODULE override_var=TEMPORAL_CLI_PATH
      ;;
    versitygw)
      version=$VERSITYGW_VERSION module=$VERSITYGW_MODULE override_var=VERSITYGW_PATH
      ;;
    *) usage ;;
  esac

  local override="${!override_var:-}"
  if [[ -n "$override" ]]; then
    absolute_executable "$override" || die "$override_var=$override is not an executable file."
    return
  fi

  local on_path
  if on_path="$(command -v "$name" 2>/dev/null)" && [[ -n "$on_path" ]]; then
    absolute_executable "$on_path" && return
  fi

  local final_dir
  final_dir="$(tools_dir)/$name-$version"
  if [[ ! -x "$final_dir/$name" ]]; then
    build_with_go "$name" "$module" "$version" "$final_dir" "$override_var"
  fi
  absolute_executable "$final_dir/$name"
}

[[ $# -eq 1 ]] || usage
resolve "$1"
