#!/usr/bin/env bash
# Continuous batching inside a chunk: does it pay? The same rollout (same checkpoint, prompts
# and seeds, one rank, lengths varying because sampling stops at <eos>) decoded three ways in
# one run:
#   all     --chunk-size PROMPTS                  every sequence of the chunk at once (today)
#   cont    --chunk-size PROMPTS --max-batch B    B slots; a finished sequence's slot takes
#                                                 the next sequence at the next step
#   waves   --chunk-size B                        static waves: consecutive groups of B
#                                                 prompts, each decoded to completion
# Repeats are interleaved (all, cont, waves, all, ...) so load drift hits every mode alike;
# medians are reported. Throughput is new tokens / decode-loop seconds (generate_seconds);
# decode_steps (load-independent) and rows_per_step = (prompt + new tokens fed) / steps say
# how full the steps were; kv_cache_bytes is the KV cache the rank allocates. The three modes must sample the same
# tokens (each sample owns its RNG); the bench checks it. The last line is one JSON object.
#
# usage: nice -n 10 bench/continuous_batching.sh [work dir]   (default: a fresh temp dir)
# env:   BUILD (native/build), REPEATS (3), B (16), PROMPTS (128), NEW_TOKENS (64), DIM (512),
#        LAYERS (2), HEADS (8), EXPERTS (32), TOPK (4), EXPERT_DIM (512), TASK (add),
#        SEED (1), THREADS (OpenBLAS threads, 1)
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=support/decode-model.sh
source "$(dirname "${BASH_SOURCE[0]}")/support/decode-model.sh"
REPEATS="${REPEATS:-3}"
B="${B:-16}"
PROMPTS="${PROMPTS:-128}"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
cd "$WORK"

require_decode_tools
init_decode_checkpoint ckpt
# no --ignore-eos: a random-init policy draws <eos> now and then, so lengths vary
ROLLOUT=(--checkpoint ckpt --task "$TASK" --seed "$SEED" --num-prompts "$PROMPTS" --samples 1
         --max-new-tokens "$NEW_TOKENS")

echo "work dir: $WORK  model: dim $DIM layers $LAYERS experts $EXPERTS top-k $TOPK" \
  "expert-dim $EXPERT_DIM  $PROMPTS sequences, <= $NEW_TOKENS new tokens, B $B" \
  " load: $(uptime)" >&2
: > runs.jsonl
for ((i = 0; i < REPEATS; i++)); do
  for mode in all cont waves; do
    case $mode in
      all) extra=(--chunk-size "$PROMPTS") ;;
      cont) extra=(--chunk-size "$PROMPTS" --max-batch "$B") ;;
      waves) extra=(--chunk-size "$B") ;;
    esac
    rm -rf "out-$mode"
    line=$("$BIN/moe_generate" "${ROLLOUT[@]}" "${extra[@]}" --out-dir "out-$mode" | tail -1)
    echo "{\"mode\":\"$mode\",\"run\":$line}" | tee -a runs.jsonl >&2
  done
done

python3 - "$B" "$PROMPTS" "$NEW_TOKENS" "$REPEATS" "$(uptime)" << 'EOF'
import glob, json, statistics, sys
B, prompts, new, reps, load = sys.argv[1:]
def samples(mode):
    out = {}
    for path in sorted(glob.glob(f"out-{mode}/chunk-*.jsonl")):
        for line in open(path):
            r = json.loads(line)
            out[r["prompt_id"], r["sample_index"]] = r
    return out
ref = samples("all")
lengths = [len(r["tokens"]) for r in ref.values()]
res = {"bench": "continuous_batching", "B": int(B), "sequences": int(prompts),
       "max_new_tokens": int(new), "repeats": int(reps), "load_after": load.strip(),
       "lengths": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)}}
runs = [json.loads(l) for l in open("runs.jsonl")]
# rows fed over the loop: every prompt token, and every new token but the last of each sample
fed = sum(len(r["prompt_tokens"]) + len(r["tokens"]) - 1 for r in ref.values())
for mode in ("all", "cont", "waves"):
    got = samples(mode)
    same = got.keys() == ref.keys() and all(got[k]["tokens"] == ref[k]["tokens"] for k in ref)
    if not same:
        sys.exit(f"{mode}: tokens differ from all-at-once")
    rs = [r["run"] for r in runs if r["mode"] == mode]
    tps = [r["new_tokens"] / r["generate_seconds"] for r in rs]
    res[mode] = {"tokens_per_s": round(statistics.median(tps), 1),
                 "tokens_per_s_runs": [round(x, 1) for x in tps],
                 "decode_steps": rs[0]["decode_steps"],
                 "rows_per_step": round(fed / rs[0]["decode_steps"], 1),
                 "kv_cache_bytes": rs[0]["kv_cache_bytes"], "same_tokens": same}
for mode in ("cont", "waves"):
    pairs = zip(res[mode]["tokens_per_s_runs"], res["all"]["tokens_per_s_runs"])
    res[mode + "_vs_all"] = round(statistics.median(a / b for a, b in pairs), 3)
print(json.dumps(res))
EOF
