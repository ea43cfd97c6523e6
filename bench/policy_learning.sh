#!/usr/bin/env bash
# Policy learning benchmark for the native MoE policy, without the orchestrator:
#   init -> SFT warm start on one task -> GRPO loop (generate -> verify -> grpo) ->
#   held-out accuracy after every iteration, plus training GFLOP/s vs OpenBLAS sgemm and
#   the KV-cache speedup at 64 new tokens, all measured in this run.
# The last line of output is one JSON object with the results.
#
# usage: bench/policy_learning.sh [work dir]     (default: a fresh temporary directory)
# env:   BUILD (native build dir, default native/build), TASK (reverse), SFT_STEPS (180),
#        SFT_BATCH (64), GRPO_ITERS (30), PROMPTS (128 per iteration), SAMPLES (8 per prompt),
#        MINIBATCHES (4 optimizer steps per epoch), EPOCHS (2), GRPO_LR (5e-4), ENTROPY_COEF (0),
#        EVAL_PROMPTS (256), SEED (1), THREADS (OpenBLAS threads, 1)
# GFLOP/s: training = median over SFT steps of model matmul FLOPs / step wall time;
# sgemm = median of 5 runs of a 1024^3 OpenBLAS sgemm, same thread count, same run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/native/build}"
BIN="$BUILD/bin"
TASK="${TASK:-reverse}"
SFT_STEPS="${SFT_STEPS:-180}"
SFT_BATCH="${SFT_BATCH:-64}"
GRPO_ITERS="${GRPO_ITERS:-30}"
PROMPTS="${PROMPTS:-128}"
SAMPLES="${SAMPLES:-8}"
EVAL_PROMPTS="${EVAL_PROMPTS:-256}"
GRPO_LR="${GRPO_LR:-5e-4}"
MINIBATCHES="${MINIBATCHES:-4}"
EPOCHS="${EPOCHS:-2}"
ENTROPY_COEF="${ENTROPY_COEF:-0}"
SEED="${SEED:-1}"
export OPENBLAS_NUM_THREADS="${THREADS:-1}"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
cd "$WORK"
mkdir -p rewards metrics kv

for tool in moe_train moe_generate moe_reward; do
  [[ -x "$BIN/$tool" ]] || { echo "missing $BIN/$tool: build native first" >&2; exit 2; }
done

# json FIELD < line : extract a numeric field from a one-line JSON object
json() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" | tail -1; }

evaluate() {  # evaluate CHECKPOINT NAME -> prints held-out greedy accuracy
  "$BIN/moe_generate" --checkpoint "$1" --task "$TASK" --split eval --seed "$SEED" \
    --num-prompts "$EVAL_PROMPTS" --samples 1 --chunk-size "$EVAL_PROMPTS" --temperature 0 \
    --out-dir "eval/$2" > /dev/null
  "$BIN/moe_reward" --rollouts "eval/$2/chunk-0.jsonl" | json accuracy
}

echo "work dir: $WORK  task: $TASK  OpenBLAS threads: $OPENBLAS_NUM_THREADS"
sgemm=$("$BIN/moe_train" sgemm --size 1024 --repeats 5 | json sgemm_gflops | head -1)
echo "sgemm: $sgemm GFLOP/s"

"$BIN/moe_train" init --out ckpt/init --seed "$SEED" --max-seq-len 96 > /dev/null
t0=$(date +%s.%N)
"$BIN/moe_train" sft --checkpoint ckpt/init --out ckpt/sft --task "$TASK" --seed "$SEED" \
  --steps "$SFT_STEPS" --batch-size "$SFT_BATCH" --lr 3e-3 --warmup-steps 10 \
  --metrics metrics/sft.jsonl > /dev/null
t1=$(date +%s.%N)
sft_seconds=$(echo "$t1 - $t0" | bc)
# training throughput: median of the per-step GFLOP/s of the SFT run
train_gflops=$(sed -n 's/.*"gflops":\([-0-9.e+]*\).*/\1/p' metrics/sft.jsonl | sort -g |
  awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
sft_acc=$(evaluate ckpt/sft sft)
echo "sft: $SFT_STEPS steps in ${sft_seconds}s, train $train_gflops GFLOP/s, held-out accuracy $sft_acc"

curve="$sft_acc"
prev=ckpt/sft
for ((i = 1; i <= GRPO_ITERS; i++)); do
  "$BIN/moe_generate" --checkpoint "$prev" --task "$TASK" --split train --seed "$SEED" \
    --iteration "$i" --first-prompt $((i * PROMPTS)) --num-prompts "$PROMPTS" \
    --samples "$SAMPLES" --chunk-size "$PROMPTS" --temperature 1 --out-dir "rollouts/$i" > /dev/null
  # list files (one path per line), as a campaign with thousands of chunks passes them
  ls "rollouts/$i"/chunk-*.jsonl > "rollouts/$i.txt"
  echo "rewards/$i.jsonl" > "rewards/$i.txt"
  train_reward=$("$BIN/moe_reward" --rollouts-file "rollouts/$i.txt" \
    --out "rewards/$i.jsonl" | json mean_reward)
  "$BIN/moe_train" grpo --checkpoint "$prev" --out "ckpt/grpo-$i" --iteration "$i" \
    --rollouts-file "rollouts/$i.txt" --rewards-file "rewards/$i.txt" \
    --lr "$GRPO_LR" --clip-eps 0.2 --minibatches "$MINIBATCHES" --epochs "$EPOCHS" --entropy-coef "$ENTROPY_COEF" --metrics metrics/grpo.jsonl > /dev/null
  acc=$(evaluate "ckpt/grpo-$i" "grpo-$i")
  curve="$curve,$acc"
  echo "grpo iteration $i: train reward $train_reward, held-out accuracy $acc"
  [[ "$prev" == ckpt/sft ]] || rm -rf "$prev"
  prev="ckpt/grpo-$i"
done

# KV cache vs recomputing the prefix: 16 prompts x 64 new tokens each (--ignore-eos keeps
# every sample generating), same policy, same outputs.
kv() {
  "$BIN/moe_generate" --checkpoint "$prev" --task "$TASK" --split eval --seed "$SEED" \
    --num-prompts 16 --samples 1 --chunk-size 16 --temperature 0 --max-new-tokens 64 \
    --ignore-eos --out-dir "kv/$1" "${@:2}" | tail -1 | json seconds
}
kv_s=$(kv cached)
rc_s=$(kv recompute --no-kv-cache)
kv_speedup=$(echo "scale=2; $rc_s / $kv_s" | bc)
echo "generation 16 x 64 tokens: kv cache ${kv_s}s, recompute ${rc_s}s, speedup ${kv_speedup}x"
echo "accuracy curve (sft, grpo 1..$GRPO_ITERS): $curve"
acc_end=${curve##*,}
printf '{"task":"%s","sft_steps":%s,"sft_seconds":%s,"sft_accuracy":%s,"grpo_accuracy_start":%s,"grpo_accuracy_end":%s,"grpo_iterations":%s,"accuracy_curve":[%s],"train_gflops":%s,"sgemm_gflops":%s,"kv_cache_speedup":%s}\n' \
  "$TASK" "$SFT_STEPS" "$sft_seconds" "$sft_acc" "$sft_acc" "$acc_end" "$GRPO_ITERS" "$curve" \
  "$train_gflops" "$sgemm" "$kv_speedup"
