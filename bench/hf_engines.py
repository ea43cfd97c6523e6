#!/usr/bin/env python3
"""moerl's native engine against PyTorch eager with transformers' model, on the same weights,
side by side in one run (1 thread each): a GRPO step (forward, backward, AdamW) and greedy
decoding with a KV cache; plus peak RSS of `moe_train init --from-hf` on 1 and 2 EP ranks.
With LLAMACPP set, the same greedy decode by llama.cpp on the same weights converted to GGUF F32
(bench/hf_engines_llamacpp.py): llama-server with one slot per sequence, and llama-batched-bench.
Repeats are interleaved (moerl, torch, moerl, ...) and medians reported; ratios are medians
of per-repeat ratios. The last line printed is one JSON object.

Run by bench/hf_engines.sh (which finds the reference Python, the native tools and llama.cpp).
env: BUILD (native/build), REPEATS (3), HIDDEN (512), LAYERS (4), EXPERTS (32), TOPK (4),
     VOCAB (16384), SEQS (32), SEQ_LEN (128), PROMPT_LEN (32), DECODE_SEQS (64), NEW_TOKENS (128),
     LLAMACPP (the folder scripts/llamacpp.sh prints; unset: llama.cpp is not measured)
"""
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

torch.set_num_threads(1)
env = lambda k, d: int(os.environ.get(k, d))  # noqa: E731
BIN = os.path.join(os.environ.get("BUILD", "native/build"), "bin")
REPEATS, HIDDEN, LAYERS, EXPERTS, TOPK, VOCAB = (env("REPEATS", 3), env("HIDDEN", 512), env("LAYERS", 4),
                                                 env("EXPERTS", 32), env("TOPK", 4), env("VOCAB", 16384))
SEQS, SEQ_LEN, PROMPT_LEN = env("SEQS", 32), env("SEQ_LEN", 128), env("PROMPT_LEN", 32)
DECODE_SEQS, NEW_TOKENS = env("DECODE_SEQS", 64), env("NEW_TOKENS", 128)
NATIVE_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}


def native(tool, args, extra_env=None):
    out = subprocess.run([os.path.join(BIN, tool), *args], check=True, capture_output=True, text=True,
                         env={**NATIVE_ENV, **(extra_env or {})})
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def cpu_model():
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")


def baseline_rss_mib():
    # a moe_train process that loads its libraries and does almost nothing
    out = subprocess.run(["/usr/bin/time", "-f", "peak_kib %M", os.path.join(BIN, "moe_train"), "sgemm",
                          "--size", "8", "--repeats", "1"], env=NATIVE_ENV, capture_output=True, text=True)
    return int(out.stderr.strip().split("peak_kib ")[-1]) / 1024


def peak_rss_mib(ranks, hf_dir, out):
    # GNU time reports the tool's own peak (a child forked from this Python would count its pages)
    port = 29000 + random.randrange(1000)
    procs = []
    for r in range(ranks):
        e = {**NATIVE_ENV, "MOERL_RANK": str(r), "MOERL_WORLD_SIZE": str(ranks),
             "MOERL_COORDINATOR": f"127.0.0.1:{port}", "MOERL_JOB_TOKEN": "bench"}
        procs.append(subprocess.Popen(["/usr/bin/time", "-f", "peak_kib %M", os.path.join(BIN, "moe_train"),
                                       "init", "--from-hf", hf_dir, "--out", out, "--max-seq-len",
                                       str(SEQ_LEN + NEW_TOKENS)],
                                      env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    peaks = []
    for p in procs:
        err = p.communicate()[1]
        assert p.returncode == 0, f"moe_train init exited {p.returncode}: {err}"
        peaks.append(int(err.strip().split("peak_kib ")[-1]) / 1024)
    return max(peaks)


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    hf = os.path.join(work, "hf")
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         moe_intermediate_size=HIDDEN // 2, num_hidden_layers=LAYERS,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=HIDDEN // 8,
                         num_experts=EXPERTS, num_experts_per_tok=TOPK, norm_topk_prob=True,
                         max_position_embeddings=1024, initializer_range=0.05, dtype="float32",
                         eos_token_id=VOCAB - 1)
    model = Qwen3MoeForCausalLM(cfg)
    model.save_pretrained(hf)
    params = sum(p.numel() for p in model.parameters())
    rng = random.Random(1)

    # ---- the GRPO batch: SEQS sequences, groups of 4 samples with varied rewards
    rollouts, rewards, seqs = os.path.join(work, "rollouts.jsonl"), os.path.join(work, "rewards.jsonl"), []
    with open(rollouts, "w") as rf, open(rewards, "w") as wf:
        for i in range(SEQS):
            prompt = [rng.randrange(VOCAB - 1) for _ in range(PROMPT_LEN)]
            comp = [rng.randrange(VOCAB - 1) for _ in range(SEQ_LEN - PROMPT_LEN)]
            lps = [-9.7 + rng.uniform(-0.1, 0.1) for _ in comp]
            seqs.append((prompt + comp, lps, (i % 4) - 1.5))
            rf.write(json.dumps({"prompt_id": i // 4, "sample_index": i % 4, "iteration": 0, "task": "bench",
                                 "prompt": "", "prompt_tokens": prompt, "tokens": comp, "text": "",
                                 "logprobs": lps, "finish_reason": "length"}) + "\n")
            wf.write(json.dumps({"prompt_id": i // 4, "sample_index": i % 4, "reward": float(i % 4)}) + "\n")
    ckpt = os.path.join(work, "ckpt")
    rss1 = peak_rss_mib(1, hf, ckpt)
    rss2 = peak_rss_mib(2, hf, os.path.join(work, "ckpt-2"))

    def moerl_train():
        lines = native("moe_train", ["grpo", "--checkpoint", ckpt, "--out", os.path.join(work, "ckpt-1"),
                                     "--rollouts", rollouts, "--rewards", rewards, "--micro-batch", str(SEQS),
                                     "--aux-coef", "0.001", "--z-coef", "0"])
        return SEQS * SEQ_LEN / [m for m in lines if "step" in m][-1]["seconds"]

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    ids = torch.tensor([s[0] for s in seqs])
    old = torch.tensor([s[1] for s in seqs])
    adv = torch.tensor([[s[2]] for s in seqs])

    def torch_train():
        t0 = time.perf_counter()
        out = model(ids, output_router_logits=True)
        logp = torch.log_softmax(out.logits[:, PROMPT_LEN - 1:-1], dim=-1)
        lp = logp.gather(-1, ids[:, PROMPT_LEN:, None])[..., 0]
        ratio = torch.exp(lp - old)
        loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean() + 0.001 * out.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        return SEQS * SEQ_LEN / (time.perf_counter() - t0)

    # ---- decode: DECODE_SEQS prompts, NEW_TOKENS greedy tokens each, no early stop
    prompts = os.path.join(work, "prompts.jsonl")
    plist = [[rng.randrange(VOCAB - 1) for _ in range(rng.randint(8, 24))] for _ in range(DECODE_SEQS)]
    with open(prompts, "w") as f:
        for i, p in enumerate(plist):
            f.write(json.dumps({"prompt_id": i, "prompt_tokens": p}) + "\n")

    def moerl_decode():
        lines = native("moe_generate", ["--checkpoint", ckpt, "--task", "bench", "--prompts", prompts,
                                        "--num-prompts", str(DECODE_SEQS), "--samples", "1", "--chunk-size",
                                        str(DECODE_SEQS), "--temperature", "0", "--max-new-tokens",
                                        str(NEW_TOKENS), "--ignore-eos", "--out-dir", os.path.join(work, "gen")])
        done = lines[-1]
        return done["new_tokens"] / done["generate_seconds"]

    width = max(len(p) for p in plist)
    left = torch.tensor([[0] * (width - len(p)) + p for p in plist])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in plist])

    def torch_decode():
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.generate(left, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, use_cache=True, pad_token_id=0)
            return (out.shape[1] - width) * DECODE_SEQS / (time.perf_counter() - t0)

    llamacpp = None
    if os.environ.get("LLAMACPP"):
        from hf_engines_llamacpp import LlamaCpp
        llamacpp = LlamaCpp(os.environ["LLAMACPP"], work, hf, VOCAB)
        llamacpp.start(DECODE_SEQS, 256)

    runs = {"moerl_train": [], "torch_train": [], "moerl_decode": [], "torch_decode": []}
    if llamacpp:
        runs.update({"llamacpp_decode": [], "llamacpp_batched_bench": []})
    for _ in range(REPEATS):
        runs["moerl_train"].append(moerl_train())
        runs["torch_train"].append(torch_train())
        model.eval()
        runs["moerl_decode"].append(moerl_decode())
        runs["torch_decode"].append(torch_decode())
        model.train()
        if llamacpp:
            tokens_per_s, llama_tokens = llamacpp.server_decode(plist, NEW_TOKENS)
            runs["llamacpp_decode"].append(tokens_per_s)
            runs["llamacpp_batched_bench"].append(llamacpp.batched_bench(DECODE_SEQS, 16, NEW_TOKENS))
    if llamacpp:
        llamacpp.stop()
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(runs[a], runs[b]))  # noqa: E731
    dense = sum(p.numel() for n, p in model.named_parameters() if ".experts." not in n)
    result = {
        "bench": "hf_engines", "params": params, "shape": {"hidden": HIDDEN, "layers": LAYERS, "experts": EXPERTS,
                                                           "top_k": TOPK, "vocab": VOCAB},
        "train_tokens_per_s": {k: statistics.median(runs[k]) for k in ("moerl_train", "torch_train")},
        "train_ratio_vs_torch": ratio("moerl_train", "torch_train"),
        "decode_tokens_per_s": {k: statistics.median(runs[k]) for k in ("moerl_decode", "torch_decode")},
        "decode_ratio_vs_transformers": ratio("moerl_decode", "torch_decode"),
        "import_peak_rss_mib": {"ranks_1": rss1, "ranks_2": rss2, "process_baseline": baseline_rss_mib()},
        "fp32_mib": {"dense": dense * 4 / 2**20, "experts": (params - dense) * 4 / 2**20},
        # peak over (baseline + dense + experts / R): the bound is 1.25
        "import_rss_over_owned": {
            f"ranks_{r}": (rss - baseline_rss_mib()) / ((dense + (params - dense) / r) * 4 / 2**20)
            for r, rss in ((1, rss1), (2, rss2))},
        "runs": runs, "repeats": REPEATS,
        # the machine: OpenBLAS's kernels decide the GRPO step's large GEMMs (docs/benchmarks.md)
        "cpu": cpu_model(),
        "blas_core": native("moe_train", ["sgemm", "--size", "64", "--repeats", "1"])[-1]["blas_core"],
    }
    if llamacpp:
        with open(os.path.join(work, "gen", "chunk-0.jsonl")) as f:
            moerl_tokens = [json.loads(line)["tokens"] for line in f if line.strip()]

        def agreeing(a, b):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n
        result.update({
            "decode_tokens_per_s_llamacpp": {k: statistics.median(runs[k])
                                             for k in ("llamacpp_decode", "llamacpp_batched_bench")},
            "decode_ratio_vs_llamacpp_server": ratio("moerl_decode", "llamacpp_decode"),
            "decode_ratio_vs_llamacpp_batched_bench": ratio("moerl_decode", "llamacpp_batched_bench"),
            # same weights, both greedy in F32: how many of each sequence's first tokens agree
            "llamacpp_greedy_agreeing_tokens": [agreeing(a, b) for a, b in zip(moerl_tokens, llama_tokens)],
        })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
