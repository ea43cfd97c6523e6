# Shared by the decode benchmarks (rollout_throughput.sh, continuous_batching.sh): the
# decode-bound MoE they measure and its random-init checkpoint. Source it after `set -euo
# pipefail`; the caller's environment overrides every default.
#   env: BUILD (native/build), DIM (512), LAYERS (2), HEADS (8), EXPERTS (32), TOPK (4),
#        EXPERT_DIM (512), NEW_TOKENS (64), TASK (add), SEED (1), THREADS (OpenBLAS threads
#        per rank, 1)
# shellcheck shell=bash
BUILD="${BUILD:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/native/build}"
BIN="$BUILD/bin"
DIM="${DIM:-512}"
LAYERS="${LAYERS:-2}"
HEADS="${HEADS:-8}"
EXPERTS="${EXPERTS:-32}"
TOPK="${TOPK:-4}"
EXPERT_DIM="${EXPERT_DIM:-512}"
NEW_TOKENS="${NEW_TOKENS:-64}"
TASK="${TASK:-add}"
SEED="${SEED:-1}"
export OPENBLAS_NUM_THREADS="${THREADS:-1}"

# Fails unless the native tools are built.
require_decode_tools() {
  local tool
  for tool in moe_train moe_generate; do
    [[ -x "$BIN/$tool" ]] || { echo "missing $BIN/$tool: build native first" >&2; exit 2; }
  done
}

# init_decode_checkpoint DIR: a random-init policy of the model above, room for NEW_TOKENS.
init_decode_checkpoint() {
  "$BIN/moe_train" init --out "$1" --seed "$SEED" --dim "$DIM" --layers "$LAYERS" \
    --heads "$HEADS" --experts "$EXPERTS" --top-k "$TOPK" --expert-dim "$EXPERT_DIM" \
    --max-seq-len $((NEW_TOKENS + 32)) > /dev/null
}
