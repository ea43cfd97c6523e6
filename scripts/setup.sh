#!/usr/bin/env bash
# shellcheck disable=SC2317 # the step functions are called indirectly, as step_<name>
# Prepares a machine to build and test moerl; safe to run again at any time, and quick when
# nothing is missing.
#
#   scripts/setup.sh [--sanitize] [STEP...]
#
# Steps, in order (default: all but temporal-cluster, kube-tools, reward-python, pyref, openenv,
# llamacpp, node-lts, native-asan and the images; --sanitize adds native-asan):
#   packages     Debian packages the native core builds against (apt-get, as root or via sudo)
#   npm          npm ci, when node_modules is missing or older than package-lock.json
#   tools        the Temporal CLI and versitygw binaries (scripts/tools.sh; built once, cached)
#   temporal-cluster  the tests' Temporal cluster: the Temporal server, its SQL schema tool and
#                schemas (scripts/tools.sh; built once, cached) and Debian's PostgreSQL (not a
#                default step: the demo runs on the dev server)
#   kube-tools   the test cluster's binaries: Kubernetes, etcd, kwok, containerd, CNI plugins,
#                CoreDNS, Kueue, KEDA (scripts/tools.sh; built once, cached; not a default step: the demo
#                does not need them, the tests do)
#   reward-python  the reward functions' pinned Python environment with math-verify
#                (scripts/reward-python.sh; made once in the tools cache; not a default step:
#                the demo does not need it, the tests do)
#   pyref        the tests' Python reference: torch, transformers, tokenizers, safetensors
#                (scripts/pyref.sh; made once in the tools cache, about 4 GB; not a default step)
#   openenv      the tests' OpenEnv servers: the openenv package (scripts/openenv.sh; made once in
#                the tools cache, about 450 MB; not a default step)
#   llamacpp     llama.cpp's llama-server and HF -> GGUF converter, the tests' CPU rollout engine
#                (scripts/llamacpp.sh; built once in the tools cache from the llama-cpp-python
#                source package; not a default step)
#   node-lts     the current Node.js LTS, the image's and the tests' second Node (scripts/node-lts.sh;
#                unpacked once in the tools cache; not a default step)
#   ts           npm run build (tsc into dist/)
#   native       cmake + ninja into native/build
#   native-asan  the same with -DMOERL_SANITIZE=ON into native/build-asan
#   image        the test node's images: the Dockerfile built by buildah, and the pause image
#                (scripts/build-image.sh; minutes the first time, seconds when nothing changed;
#                not a default step)
#   image-pytorch  the Dockerfile's PyTorch image (scripts/build-image.sh moerl-pytorch; about
#                7 GB, ten minutes or more the first time; not a default step)
# MOERL_SKIP_NATIVE=1 skips both native steps. Output of each step goes to .moerl/logs/;
# its tail is shown when the step fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

# Debian packages for the native core: compiler and build tools, libfabric (EP transport),
# OpenBLAS (GEMM), OpenMPI (benchmark baseline only), GoogleTest.
DEBIAN_PACKAGES=(
  g++ cmake ninja-build pkg-config
  libfabric-dev libopenblas-dev libopenmpi-dev openmpi-bin libgtest-dev
  nlohmann-json3-dev libssl-dev libcli11-dev  # JSON, sha256 (libcrypto), tool flags
  python3  # the golden-reference test regenerates model_tiny.golden
  runc  # the test node's container runtime (containerd 2 is built from Go modules)
  chromium  # headless browser: the report test renders moerl report's page in it
  tmux  # the pseudo-terminal the watch test runs moerl watch in
  bubblewrap  # the reward functions' jail (activities/rewards/sandbox.ts)
  buildah debootstrap  # the Dockerfile's builder and its locally made base (scripts/build-image.sh)
)
ALL_STEPS=(packages npm tools temporal-cluster kube-tools reward-python pyref openenv llamacpp node-lts ts native native-asan image image-pytorch)

LOG_DIR="$ROOT/.moerl/logs"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e '/shellcheck/d' -e 's/^# \{0,1\}//'
  exit "${1:-2}"
}

sanitize=0
steps=()
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    -h | --help) usage 0 ;;
    -*) echo "setup.sh: unknown option $arg" >&2 && usage >&2 ;;
    *)
      [[ " ${ALL_STEPS[*]} " == *" $arg "* ]] || { echo "setup.sh: unknown step $arg" >&2 && usage >&2; }
      steps+=("$arg")
      ;;
  esac
done
if [[ ${#steps[@]} -eq 0 ]]; then
  steps=(packages npm tools ts native)
  [[ $sanitize -eq 1 ]] && steps+=(native-asan)
fi

say() { echo "setup: $*"; }

# run_logged <log name> <command...>: output to the step's log; on failure, show its tail.
run_logged() {
  local name="$1"
  shift
  mkdir -p "$LOG_DIR"
  local log="$LOG_DIR/setup-$name.log"
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] && return 0
  echo "---- last lines of $log ----" >&2
  tail -n 40 "$log" >&2
  echo "----" >&2
  return "$rc"
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    return 127
  fi
}

# install_packages <step> <package...>: the Debian packages of a step that are missing.
install_packages() {
  local step="$1" missing=() pkg
  shift
  if ! command -v dpkg-query >/dev/null 2>&1; then
    say "$step: not a Debian system; make sure the equivalents of these are installed: $*"
    return 0
  fi
  for pkg in "$@"; do
    [[ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)" == installed ]] || missing+=("$pkg")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    say "$step: Debian packages all present"
    return 0
  fi
  say "$step: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]] && ! command -v sudo >/dev/null 2>&1; then
    say "$step: not root and no sudo; install them as root: apt-get install ${missing[*]}"
    return 1
  fi
  run_logged "$step" as_root env DEBIAN_FRONTEND=noninteractive \
    bash -c 'apt-get update && apt-get install -y --no-install-recommends "$@"' apt "${missing[@]}"
}

step_packages() { install_packages packages "${DEBIAN_PACKAGES[@]}"; }

step_npm() {
  command -v node >/dev/null 2>&1 || {
    say "npm: Node.js is not installed; install Node 20 (20.19 or newer) and run this again"
    return 1
  }
  local major
  major="$(node -p 'process.versions.node.split(".")[0]')"
  [[ $major -ge 20 ]] || {
    say "npm: Node $(node --version) is too old; Node 20.19 or newer is needed"
    return 1
  }
  # npm writes node_modules/.package-lock.json on every install: a lockfile newer than it
  # means the dependencies changed since.
  if [[ -f node_modules/.package-lock.json && ! package-lock.json -nt node_modules/.package-lock.json ]]; then
    say "npm: node_modules up to date"
    return 0
  fi
  say "npm: npm ci"
  run_logged npm npm ci --no-audit --no-fund
}

step_tools() {
  local tool path
  for tool in temporal versitygw; do
    path="$(run_tool "$tool")" || return 1
    say "tools: $tool $path"
  done
}

# PostgreSQL without the cluster Debian's package would make and start: the tests make their
# own, on a port of their own (test/support/temporal-cluster.ts). The server build follows the
# CLI's in the same run, whose Go caches it mostly reuses.
step_temporal_cluster() {
  local tool path
  if [[ ! -e /etc/postgresql-common/createcluster.d/moerl.conf ]] && command -v dpkg-query >/dev/null 2>&1 &&
    [[ "$(dpkg-query -W -f='${db:Status-Status}' postgresql 2>/dev/null)" != installed ]]; then
    as_root mkdir -p /etc/postgresql-common/createcluster.d &&
      echo 'create_main_cluster = false' | as_root tee /etc/postgresql-common/createcluster.d/moerl.conf >/dev/null ||
      return 1
  fi
  install_packages temporal-cluster postgresql || return 1
  for tool in temporal-server temporal-sql-tool temporal-server-schema; do
    path="$(run_tool "$tool")" || return 1
    say "temporal-cluster: $tool $path"
  done
}

# The test cluster: control plane (one build gives all five Kubernetes binaries), etcd, kwok,
# the real node's containerd, CNI plugins and CoreDNS, Kueue for the queueing tests, KEDA's CRDs
# for the autoscaling manifests (a module download) and KEDA's operator and metrics server for the
# autoscaling test (the longest build after Kubernetes). Built once into the tools cache.
step_kube_tools() {
  local tool path
  for tool in kube-apiserver etcd kwok containerd cni-plugins coredns kueue keda-crds keda-operator; do
    path="$(run_tool "$tool")" || return 1
    say "tools: $tool $path"
  done
}

# tools.sh prints the path on stdout; its progress (a first build) goes to the log.
run_tool() {
  mkdir -p "$LOG_DIR"
  local log="$LOG_DIR/setup-tools-$1.log"
  if bash "$ROOT/scripts/tools.sh" "$1" 2>"$log"; then
    return 0
  fi
  grep '^tools.sh:' "$log" >&2 || tail -n 20 "$log" >&2
  return 1
}

# cached_step <step> <script>: makes (once) and names a tool the script keeps in the tools cache
# (the pinned Python environments, the Node.js LTS).
cached_step() {
  local path
  mkdir -p "$LOG_DIR"
  path="$(bash "$ROOT/scripts/$2" 2>"$LOG_DIR/setup-$1.log")" || {
    tail -n 20 "$LOG_DIR/setup-$1.log" >&2
    return 1
  }
  say "$1: $path"
}

step_reward_python() { cached_step reward-python reward-python.sh; }
step_pyref() { cached_step pyref pyref.sh; }
step_openenv() { cached_step openenv openenv.sh; }
step_node_lts() { cached_step node-lts node-lts.sh; }

# llama.cpp: the path on stdout, a first build's progress (cmake, ninja) to the log.
step_llamacpp() {
  local path
  mkdir -p "$LOG_DIR"
  path="$(bash "$ROOT/scripts/llamacpp.sh" 2>"$LOG_DIR/setup-llamacpp.log")" || {
    tail -n 20 "$LOG_DIR/setup-llamacpp.log" >&2
    return 1
  }
  say "llamacpp: $path"
}

step_ts() {
  say "ts: tsc"
  run_logged ts npm run --silent build
}

# build_native <build dir> <extra cmake args...>
build_native() {
  local dir="$1"
  shift
  if [[ ! -f "$dir/build.ninja" ]]; then
    say "$(basename "$dir"): cmake configure"
    run_logged "$(basename "$dir")-configure" cmake -S native -B "$dir" -G Ninja "$@" || return 1
  fi
  say "$(basename "$dir"): ninja"
  run_logged "$(basename "$dir")" ninja -C "$dir"
}

step_native() { build_native native/build; }
step_native_asan() { build_native native/build-asan -DMOERL_SANITIZE=ON; }
step_image() {
  say "image: scripts/build-image.sh moerl pause"
  run_logged image bash scripts/build-image.sh moerl pause
}
step_image_pytorch() {
  say "image-pytorch: scripts/build-image.sh moerl-pytorch"
  run_logged image-pytorch bash scripts/build-image.sh moerl-pytorch
}

failed=0
for step in "${steps[@]}"; do
  if [[ $step == native* && ${MOERL_SKIP_NATIVE:-0} == 1 ]]; then
    say "$step: skipped (MOERL_SKIP_NATIVE=1)"
    continue
  fi
  started=$SECONDS
  if "step_${step//-/_}"; then
    [[ $((SECONDS - started)) -ge 2 ]] && say "$step: done in $((SECONDS - started))s"
  else
    say "$step: FAILED"
    failed=1
    break
  fi
done
# The tool builds' Go caches go once the run's tool steps are done (scripts/tools.sh).
if [[ " ${steps[*]} " == *" tools "* || " ${steps[*]} " == *" temporal-cluster "* || " ${steps[*]} " == *" kube-tools "* ]]; then
  bash "$ROOT/scripts/tools.sh" --clean-go-caches 2>&1 | sed 's/^tools.sh: /setup: /'
fi
exit $failed
