#!/usr/bin/env bash
# Expert-parallel rollout throughput: the same rollout (same checkpoint, prompts, seeds and
# batch) decoded on RANKS processes three ways, in one run:
#   ll     moe_generate --ep-mode ll      (low-latency dispatch/combine, ep/low_latency.h)
#   normal moe_generate --ep-mode normal  (ep::Buffer: layout, dispatch, combine)
#   mpi    rollout_bench_mpi under mpirun (Megatron's MPI_Alltoallv dispatcher)
# over shm and over tcp (loopback). Repeats are interleaved (ll, normal, mpi, ll, ...) so load
# drift on a shared host hits every mode alike; medians are reported, and ratios are medians
# of the per-repeat ratios. Throughput is new
# tokens of the whole fleet / rank 0's decode-loop seconds; each decode step is split into
# experts (router, top-k, grouping, expert GEMMs), EP (dispatch + combine, including waiting
# for the other rank) and the rest (attention, norms, LM head, sampling: "attention").
# The last line of output is one JSON object.
#
# usage: bench/rollout_throughput.sh [work dir]     (default: a fresh temporary directory)
# env:   BUILD (native/build), RANKS (2), PROVIDERS ("shm tcp"), REPEATS (5), DIM (512),
#        LAYERS (2), HEADS (8), EXPERTS (32), TOPK (4), EXPERT_DIM (512), SEQS_PER_RANK (64),
#        NEW_TOKENS (64), TASK (add), SEED (1), THREADS (OpenBLAS threads per rank, 1)
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=support/decode-model.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/decode-model.sh"
RANKS="${RANKS:-2}"
PROVIDERS="${PROVIDERS:-shm tcp}"
REPEATS="${REPEATS:-5}"
SEQS_PER_RANK="${SEQS_PER_RANK:-64}"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
cd "$WORK"

require_decode_tools
HAVE_MPI=0
[[ -x "$BIN/rollout_bench_mpi" ]] && command -v mpirun > /dev/null && HAVE_MPI=1
[[ $HAVE_MPI == 1 ]] || echo "no rollout_bench_mpi or mpirun: the MPI baseline is skipped" >&2

PROMPTS=$((RANKS * SEQS_PER_RANK))
init_decode_checkpoint ckpt
ROLLOUT=(--checkpoint ckpt --task "$TASK" --seed "$SEED" --num-prompts "$PROMPTS" --samples 1
         --max-new-tokens "$NEW_TOKENS" --ignore-eos)

# ranks PROVIDER ARGS... : runs ARGS as RANKS processes under the rank contract; prints rank
# 0's last stdout line
ranks() {
  local provider=$1 pids=() r rc=0 port
  shift
  # a port the kernel just handed out and released (a random one collided with a live server)
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for ((r = 0; r < RANKS; r++)); do
    MOERL_RANK=$r MOERL_WORLD_SIZE=$RANKS MOERL_COORDINATOR=127.0.0.1:$port \
      MOERL_FI_PROVIDER=$provider MOERL_TIMEOUT_S=120 "$@" > "rank$r.out" 2> "rank$r.err" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  if [[ $rc != 0 ]]; then cat rank*.err >&2; return 1; fi
  tail -1 rank0.out
}

mpi() {
  local btl=self,vader
  [[ $1 == shm ]] || btl=self,tcp
  local root=()
  [[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
  mpirun -np "$RANKS" --oversubscribe --bind-to none "${root[@]}" --mca btl "$btl" \
    "$BIN/rollout_bench_mpi" "${ROLLOUT[@]}" | tail -1
}

echo "work dir: $WORK  ranks: $RANKS  model: dim $DIM layers $LAYERS experts $EXPERTS top-k $TOPK" \
  "expert-dim $EXPERT_DIM  $SEQS_PER_RANK sequences per rank, $NEW_TOKENS new tokens" >&2
: > runs.jsonl
for ((i = 0; i < REPEATS; i++)); do
  for provider in $PROVIDERS; do
    for mode in ll normal; do
      line=$(ranks "$provider" "$BIN/moe_generate" "${ROLLOUT[@]}" --chunk-size "$PROMPTS" \
        --out-dir "out-$mode-$provider" --ep-mode "$mode")
      echo "{\"provider\":\"$provider\",\"run\":$line}" | tee -a runs.jsonl >&2
    done
    if [[ $HAVE_MPI == 1 ]]; then
      line=$(mpi "$provider")
      echo "{\"provider\":\"$provider\",\"run\":$line}" | tee -a runs.jsonl >&2
    fi
  done
done

# Decode steps of the loop: every rank steps until the longest prompt + new tokens - 1.
python3 - "$NEW_TOKENS" "$RANKS" "$SEQS_PER_RANK" "$DIM" "$LAYERS" "$EXPERTS" "$TOPK" \
  "$EXPERT_DIM" "$REPEATS" "$(ls -d out-ll-* | head -1)/chunk-0.jsonl" << 'EOF'
import json, statistics, sys
new, R, spr, dim, layers, E, K, F, reps, chunk = sys.argv[1:]
new, R, spr, reps = int(new), int(R), int(spr), int(reps)
longest = max(len(json.loads(l)["prompt_tokens"]) for l in open(chunk))
steps = longest + new - 1
runs = [json.loads(l) for l in open("runs.jsonl")]
out = {"bench": "rollout_throughput", "ranks": R, "sequences_per_rank": spr,
       "new_tokens_per_sequence": new, "decode_steps": steps, "repeats": reps,
       "model": {"dim": int(dim), "layers": int(layers), "experts": int(E), "top_k": int(K),
                 "expert_dim": int(F)}}
med = statistics.median
for provider in sorted({r["provider"] for r in runs}):
    res = {}
    for mode in ("ll", "normal", "mpi"):
        rs = [r["run"] for r in runs if r["provider"] == provider and r["run"]["ep_mode"] == mode]
        if not rs:
            continue
        g = [r["generate_seconds"] for r in rs]
        ms = lambda key: round(med(r[key] for r in rs) / steps * 1e3, 3)
        step = med(g) / steps * 1e3
        res[mode] = {"tokens_per_s": round(med(r["new_tokens"] / r["generate_seconds"] for r in rs), 1),
                     "step_ms": round(step, 3), "experts_ms": ms("experts_seconds"),
                     "ep_ms": ms("ep_seconds"),
                     "attention_ms": round(step - ms("experts_seconds") - ms("ep_seconds"), 3),
                     "tokens_per_s_runs": [round(r["new_tokens"] / r["generate_seconds"], 1) for r in rs]}
    # side by side: ratio of the runs of one repeat (neighbours in time), then the median
    for other in ("mpi", "normal"):
        if "ll" in res and other in res:
            pairs = zip(res["ll"]["tokens_per_s_runs"], res[other]["tokens_per_s_runs"])
            res["ll_vs_" + other] = round(med(a / b for a, b in pairs), 3)
    out[provider] = res
print(json.dumps(out))
EOF
