#!/usr/bin/env bash
# Prints the folder of moerl's llama.cpp build, building it the first time: llama.cpp as vendored
# by the llama-cpp-python source package (one pinned version, fetched from PyPI with pip and
# checked against its sha256), built with CMake for the CPU only and generic x86-64 (AVX2 and
# FMA, nothing of this machine's), no network during the build, with one patch of ours
# (scripts/llamacpp/server-logprob-per-token.patch: llama-server leaves out the log-prob of a token
# that ends inside a UTF-8 character, which byte-level BPE models sample all the time; with it
# every sampled token keeps its entry). The folder holds
#   bin/llama-server         the OpenAI-compatible server the rollout engine tests run
#   bin/llama-batched-bench  llama.cpp's decode benchmark (bench/hf_engines)
#   convert/                 llama.cpp's HF -> GGUF converter with its conversion/ package and the
#                            gguf-py it was released with (run by scripts/llamacpp/convert.py)
#   LICENSE                  llama.cpp's (MIT)
#
#   scripts/llamacpp.sh            # the folder's path (builds once, then only checks)
#   scripts/llamacpp.sh --find     # the path, or exit 1 saying why: never builds
#   MOERL_LLAMACPP_DIR=/path       # use this folder instead (it must hold bin/llama-server)
#
# The build goes to ${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/moerl/tools}/llamacpp-<version>/,
# made aside and moved into place, marked complete last; a changed patch makes it build again.
# Progress goes to stderr.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
PATCH="$ROOT/scripts/llamacpp/server-logprob-per-token.patch"

log() { echo "llamacpp: $*" >&2; }
die() {
  log "$*"
  exit 1
}

find_only=0
case "${1:-}" in
  --find) find_only=1 ;;
  "") ;;
  *)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

if [[ -n "${MOERL_LLAMACPP_DIR:-}" ]]; then
  [[ -x "$MOERL_LLAMACPP_DIR/bin/llama-server" ]] ||
    die "MOERL_LLAMACPP_DIR=$MOERL_LLAMACPP_DIR has no executable bin/llama-server."
  echo "$MOERL_LLAMACPP_DIR"
  exit 0
fi

base="${MOERL_TOOLS_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/moerl/tools}"
final="$base/llamacpp-$LLAMA_CPP_PYTHON_VERSION"
patch_digest="$(sha256sum "$PATCH" | cut -c1-64)"
if [[ -f "$final/.complete" && -x "$final/bin/llama-server" && "$(cat "$final/PATCH.sha256" 2>/dev/null)" == "$patch_digest" ]]; then
  echo "$final"
  exit 0
fi
[[ $find_only -eq 0 ]] || die "no $final built with this checkout's patch (bash scripts/llamacpp.sh builds it)"

for tool in python3 cmake ninja g++ git; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed to build llama.cpp (bash scripts/setup.sh packages)."
done
mkdir -p "$base"
find "$base" -maxdepth 1 -name ".build-llamacpp-*" -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
tmp="$(mktemp -d "$base/.build-llamacpp-XXXXXX")"
# shellcheck disable=SC2064 # expand now: the trap removes this build's folder
trap "rm -rf '$tmp'" EXIT
started=$SECONDS

# The source package, hash-checked. Only it is taken from source (--no-binary names it alone):
# pip prepares its metadata with scikit-build-core, which comes as a wheel.
log "fetching llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (source package) from PyPI"
pip=(python3 -m pip)
if ! python3 -m pip --version >/dev/null 2>&1; then
  python3 -m venv "$tmp/pip" >&2
  pip=("$tmp/pip/bin/python" -m pip)
fi
echo "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION --hash=sha256:$LLAMA_CPP_PYTHON_SHA256" >"$tmp/requirements.txt"
"${pip[@]}" download --quiet --disable-pip-version-check --no-input --no-deps \
  --no-binary llama-cpp-python --require-hashes -r "$tmp/requirements.txt" -d "$tmp/sdist" >&2 ||
  die "pip could not download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (see its output above)."
mkdir "$tmp/src"
tar -xzf "$tmp/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$tmp/src" --no-same-owner
src="$tmp/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
[[ -f "$src/CMakeLists.txt" ]] || die "the source package has no vendor/llama.cpp"
(cd "$src" && git apply -p1 "$PATCH") || die "$PATCH does not apply to llama-cpp-python $LLAMA_CPP_PYTHON_VERSION."
log "fetched in $((SECONDS - started))s; building llama-server and llama-batched-bench"

# GGML_NATIVE=OFF: no -march=native; ggml then builds its generic x86-64 set (SSE4.2, AVX, AVX2,
# FMA, F16C, BMI2). The web UI is neither built (npm) nor downloaded (LLAMA_USE_PREBUILT_UI
# fetches it from a model hub at build time); no HTTPS, tests or examples; static libraries, so
# the binaries need only the C++ and OpenMP runtimes.
cmake -S "$src" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_CCACHE=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF >&2
ninja -C "$tmp/build" llama-server llama-batched-bench >&2 || die "the llama.cpp build failed (see above)."

out="$tmp/out"
mkdir -p "$out/bin" "$out/convert/models"
for bin in llama-server llama-batched-bench; do
  install -m 0755 -s "$tmp/build/bin/$bin" "$out/bin/$bin"
done
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$out/convert/"
cp -r "$src/models/templates" "$out/convert/models/"
cp "$src/LICENSE" "$out/LICENSE"
"$out/bin/llama-server" --version >"$out/VERSION" 2>&1 || die "the built llama-server does not run."
echo "$patch_digest" >"$out/PATCH.sha256"
touch "$out/.complete"
rm -rf "$final"
mv "$out" "$final"
log "built in $((SECONDS - started))s: $final"
echo "$final"
