#!/usr/bin/env bash
# moerl against PyTorch eager + transformers on the same Qwen3-MoE weights (bench/hf_engines.py):
# GRPO step tokens/s, greedy decode tokens/s, import peak RSS on 1 and 2 ranks; and the same
# decode by llama.cpp on the same weights (GGUF F32). One JSON line.
#   usage: bench/hf_engines.sh [work dir]        env: see bench/hf_engines.py
#   LLAMACPP= (empty) leaves llama.cpp out; unset, scripts/llamacpp.sh finds it (building it once).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
python="$(bash "$ROOT/scripts/pyref.sh")"
export BUILD="${BUILD:-$ROOT/native/build}"
for tool in moe_train moe_generate; do
  [[ -x "$BUILD/bin/$tool" ]] || { echo "hf_engines: build the native tools first (bash scripts/setup.sh native)" >&2; exit 1; }
done
if [[ -z "${LLAMACPP+set}" ]]; then
  LLAMACPP="$(bash "$ROOT/scripts/llamacpp.sh")"
fi
export LLAMACPP
# hf_engines.py imports hf_engines_llamacpp.py: no __pycache__ left in the checkout
export PYTHONDONTWRITEBYTECODE=1
exec "$python" "$ROOT/bench/hf_engines.py" "$@"
