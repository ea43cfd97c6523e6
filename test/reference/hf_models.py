#!/usr/bin/env python3
"""transformers' side of moerl's Hugging Face model tests (scripts/pyref.sh's environment).

  hf_models.py make OUT_DIR --family qwen3_moe|mixtral [--dtype float32|bfloat16] [--seed S]
                    [--published-shape]
      A tiny model made offline from a config with a fixed seed, saved with save_pretrained,
      with the test tokenizer (make_tokenizer.py) and a generation_config.json.
      --published-shape (qwen3_moe): every layer sparse and norm_topk_prob true, as published
      Qwen3-MoE checkpoints are; llama.cpp's qwen3moe runs only that shape.
  hf_models.py score DIR SEQUENCES.jsonl [--temperature T]
      Per line {"tokens":[...]}: {"logprobs":[log p(tokens[t] | tokens[<t]) for t >= 1]}, fp32
      logits, p = softmax(logits / T) in float64 (default T = 1).
  hf_models.py generate DIR PROMPTS.jsonl N
      Per line {"prompt_tokens":[...]}: {"tokens":[N greedy new tokens]} (KV cache, no eos stop).
  hf_models.py grad DIR BATCH.jsonl OUT_DIR --loss sft|grpo [--aux-coef C] [--clip-eps E]
                    [--clip-high E] [--entropy-coef H] [--temperature T] [--policy-loss P]
                    [--aggregation A] [--norm-tokens M] [--kl-coef K --kl-estimator k1|k2|k3]
                    [--kl-in-reward] [--advantage EST] [--float64]
      The loss moerl's trainers define (docs/native-model.md, docs/algorithms.md), written here
      from those formulas, by torch autograd over the whole batch in one forward: gradients
      saved as a model (save_pretrained: the on-disk tensor names) in OUT_DIR, and {"loss":...}
      printed (and "clipped": the tokens whose clip took effect). GRPO rows give "old_logprobs", "advantage" (or "group" and "reward": advantages
      by --advantage, a group of equal rewards left out), "ref_logprobs" with --kl-coef, and an
      optional "loss_mask". --kl-in-reward: the KL goes off each row's reward instead of into the
      loss. --float64 runs the model in float64: a reference for fp32 trainers.
  hf_models.py grad-cases DIR BATCH.jsonl CASES.jsonl
      grad once per line {"out": OUT_DIR, "flags": [grad's flags]}, in one process (torch is
      imported once), one printed line per case.
  hf_models.py compare A B [A B ...]
      Per pair, two safetensors files or HF directories, tensor by tensor: one line
      {"tensors":n, "missing":[names in one only], "bitwise":bool (same dtype, shape and bytes),
      "max_rel_l2":x, "worst":name}.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 2048
torch.set_num_threads(1)


def tiny_config(family, dtype, published_shape=False):
    if family == "qwen3_moe":
        # GQA 4:1, head_dim 24 != hidden / heads = 16, norm_topk_prob false, layer 1 dense
        # (mlp_only_layers), untied embeddings; published_shape: renormalised, no dense layer
        return Qwen3MoeConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=24,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=published_shape,
            mlp_only_layers=[] if published_shape else [1],
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            router_aux_loss_coef=0.001, initializer_range=0.08, bos_token_id=None,
            eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 3, dtype=dtype)
    return MixtralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=0.08, bos_token_id=None, eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 3, dtype=dtype)


def make(args):
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    cls = Qwen3MoeForCausalLM if args.family == "qwen3_moe" else MixtralForCausalLM
    model = cls(tiny_config(args.family, args.dtype, args.published_shape))
    with torch.no_grad():
        # routers far from uniform, so no top-k choice is a near tie that rounding could flip
        for name, p in model.named_parameters():
            if name.endswith("gate.weight") and p.dim() == 2 and p.shape[0] < 16:
                p.normal_(0.0, 1.0)
    model.to(dtype).save_pretrained(args.out_dir)
    GenerationConfig(eos_token_id=[VOCAB - 1, VOCAB - 3], do_sample=True, temperature=1.0).save_pretrained(
        args.out_dir)
    subprocess.run([sys.executable, os.path.join(HERE, "make_tokenizer.py"), args.out_dir,
                    "--vocab-size", str(VOCAB)], check=True)


def load(path, dtype=torch.float32):
    # eager experts: the grouped matmul kernel takes no float64
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager",
                                                 experts_implementation="eager")
    model.eval()
    return model


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def score(args):
    model = load(args.dir)
    with torch.no_grad():
        for row in lines(args.sequences):
            ids = torch.tensor([row["tokens"]])
            logits = model(ids).logits[0].double()
            lp = torch.log_softmax(logits / args.temperature, dim=-1)
            out = [lp[t - 1, row["tokens"][t]].item() for t in range(1, len(row["tokens"]))]
            print(json.dumps({"logprobs": out}))


def generate(args):
    model = load(args.dir)
    with torch.no_grad():
        for row in lines(args.prompts):
            ids = torch.tensor([row["prompt_tokens"]])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=args.n, min_new_tokens=args.n, use_cache=True,
                                 eos_token_id=None, pad_token_id=0)
            print(json.dumps({"tokens": out[0, ids.shape[1]:].tolist()}))


def reference_advantages(rows, estimator):
    """docs/algorithms.md's advantage estimators from each row's "group" and "reward", in float64
    and kept as float32: per row its advantage, or None where its group's rewards are all equal."""
    groups = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["group"], []).append(i)
    adv = [None] * len(rows)
    for members in groups.values():
        R = [float(rows[i]["reward"]) for i in members]
        G = len(R)
        mean = sum(R) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in R) / G)
        if std < 1e-6:
            continue
        for i, x in zip(members, R):
            if estimator == "group-norm":
                adv[i] = (x - mean) / (std + 1e-6)
            elif estimator == "rloo":  # the mean of the other samples as the baseline
                adv[i] = x - (sum(R) - x) / (G - 1)
            else:  # group-mean, and reinforce-pp-baseline before its whitening
                adv[i] = x - mean
    if estimator == "reinforce-pp-baseline":
        kept = [i for i in range(len(rows)) if adv[i] is not None]
        n = {i: trained_count(rows[i]) for i in kept}
        W = sum(n.values())
        mu = sum(n[i] * adv[i] for i in kept) / W
        var = sum(n[i] * (adv[i] - mu) ** 2 for i in kept) / W
        for i in kept:
            adv[i] = (adv[i] - mu) / math.sqrt(var + 1e-8)
    return [None if a is None else float(torch.tensor(a, dtype=torch.float32)) for a in adv]


def trained_count(row):
    completion = len(row["tokens"]) - row["prompt_len"]
    return sum(1 for m in row.get("loss_mask", [1] * completion) if m)


def grpo_token_loss(args, lp, old, ref, advantage, seq_ratio):
    """L_t of docs/algorithms.md (TIS off: w_t = 1) for one token: lp its float64 log-prob under
    the model, old and ref the rows' numbers, seq_ratio GSPO's sg(s_i) (other losses: None)."""
    eps_low, eps_high = args.clip_eps, args.clip_eps if args.clip_high is None else args.clip_high
    ratio = torch.exp(lp - old)
    if args.policy_loss == "cispo":  # MiniMax-M1: a clipped IS weight, detached, times log p
        weight = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
        policy = -weight * advantage * lp
        clipped = bool(weight != ratio)
    else:
        if args.policy_loss == "gspo":  # GSPO-token: s_i,t = sg(s_i) pi(y_t) / sg(pi(y_t))
            ratio = seq_ratio * torch.exp(lp - lp.detach())
        unclipped, clipped_term = ratio * advantage, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantage
        policy = -torch.minimum(unclipped, clipped_term)
        clipped = bool(clipped_term < unclipped)
    loss = policy
    if args.kl_coef and not args.kl_in_reward:
        loss = loss + args.kl_coef * reference_kl(ref - lp, args.kl_estimator)
    return loss, clipped


def reference_kl(d, estimator):
    """Schulman's estimators of KL(p || p_ref) from d = log p_ref - log p (a tensor or a float)."""
    exp = torch.exp if torch.is_tensor(d) else math.exp
    return {"k1": lambda: -d, "k2": lambda: d * d / 2, "k3": lambda: exp(d) - d - 1}[estimator]()


def sequence_weight(args, n_i, N, T):
    """c_i of docs/algorithms.md's aggregation modes."""
    return 1.0 / {"token-mean": lambda: T, "seq-mean-token-sum": lambda: N, "seq-mean-token-mean": lambda: N * n_i,
                  "seq-mean-token-sum-norm": lambda: N * args.norm_tokens}[args.aggregation]()


def grad(args):
    model = load(args.dir, torch.float64 if args.float64 else torch.float32)
    model.train()  # no dropout in these models; router noise is off
    rows = lines(args.batch)
    if args.kl_in_reward:  # the KL of the behaviour policy to the reference, off each reward
        rows = [dict(r, reward=r["reward"] - args.kl_coef * sum(
            reference_kl(r["ref_logprobs"][j] - r["old_logprobs"][j], args.kl_estimator)
            for j in range(len(r["old_logprobs"])) if r.get("loss_mask") is None or r["loss_mask"][j]))
            for r in rows]
    if args.loss == "grpo" and "reward" in rows[0]:
        rows = [dict(r, advantage=a) for r, a in zip(rows, reference_advantages(rows, args.advantage))
                if a is not None]
    B, T = len(rows), max(len(r["tokens"]) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r["tokens"])] = torch.tensor(r["tokens"])
        mask[b, :len(r["tokens"])] = 1
    out = model(ids, attention_mask=mask, output_router_logits=True)
    tau = args.temperature if args.loss == "grpo" else 1.0
    logp = torch.log_softmax(out.logits.double() / tau, dim=-1)
    counts = [trained_count(r) for r in rows]
    n_tok, n_seq = sum(counts), sum(1 for n in counts if n > 0)
    total, clipped = 0.0, 0
    for b, r in enumerate(rows):
        trained = [j for j in range(len(r["tokens"]) - r["prompt_len"])
                   if r.get("loss_mask") is None or r["loss_mask"][j]]
        lps = {j: logp[b, r["prompt_len"] - 1 + j, r["tokens"][r["prompt_len"] + j]] for j in trained}
        if args.loss == "sft":
            total = total - sum(lps.values()) / n_tok
            continue
        seq_ratio = None
        if args.policy_loss == "gspo" and trained:  # s_i: the geometric mean of the token ratios
            seq_ratio = torch.exp(sum(lps[j].detach() - r["old_logprobs"][j] for j in trained) / len(trained))
        seq = 0.0
        for j in trained:
            t = r["prompt_len"] - 1 + j
            ref = r["ref_logprobs"][j] if args.kl_coef and not args.kl_in_reward else None
            entropy = -(logp[b, t].exp() * logp[b, t]).sum()
            token, was_clipped = grpo_token_loss(args, lps[j], r["old_logprobs"][j], ref, r["advantage"], seq_ratio)
            seq = seq + token - args.entropy_coef * entropy
            clipped += was_clipped
        if trained:
            total = total + sequence_weight(args, len(trained), n_seq, n_tok) * seq
    loss = total + args.aux_coef * out.aux_loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.grad)
    model.float().save_pretrained(args.out_dir)
    print(json.dumps({"loss": loss.item(), "aux_loss": out.aux_loss.item(), "clipped": clipped}))


def tensors(path):
    from safetensors import safe_open
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
            else ["model.safetensors"]
        files = [os.path.join(path, f) for f in files]
    else:
        files = [path]
    out = {}
    for f in files:
        with safe_open(f, "pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def compare(args):
    if len(args.paths) % 2:
        sys.exit(f"compare: {len(args.paths)} paths given, want pairs A B [A B ...]")
    for i in range(0, len(args.paths), 2):
        compare_pair(args.paths[i], args.paths[i + 1])


def compare_pair(path_a, path_b):
    a, b = tensors(path_a), tensors(path_b)
    common = sorted(set(a) & set(b))
    bitwise = set(a) == set(b)
    worst, worst_name = 0.0, ""
    for k in common:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            bitwise = False
        elif not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            bitwise = False
        if x.shape != y.shape:
            worst, worst_name = float("inf"), k
            continue
        d = ((x.double() - y.double()).norm() / max(y.double().norm().item(), 1e-30)).item()
        if d > worst:
            worst, worst_name = d, k
    print(json.dumps({"tensors": len(common), "missing": sorted(set(a) ^ set(b)), "bitwise": bitwise,
                      "max_rel_l2": worst, "worst": worst_name}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("out_dir")
    p.add_argument("--family", required=True, choices=["qwen3_moe", "mixtral"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--published-shape", action="store_true")
    p = sub.add_parser("score")
    p.add_argument("dir")
    p.add_argument("sequences")
    p.add_argument("--temperature", type=float, default=1.0)
    p = sub.add_parser("generate")
    p.add_argument("dir")
    p.add_argument("prompts")
    p.add_argument("n", type=int)
    p = sub.add_parser("grad")
    p.add_argument("dir")
    p.add_argument("batch")
    p.add_argument("out_dir")
    p.add_argument("--loss", required=True, choices=["sft", "grpo"])
    p.add_argument("--aux-coef", type=float, default=0.0)
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--clip-high", type=float, default=None)
    p.add_argument("--entropy-coef", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--policy-loss", default="ppo-clip", choices=["ppo-clip", "gspo", "cispo"])
    p.add_argument("--aggregation", default="token-mean",
                   choices=["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
    p.add_argument("--norm-tokens", type=float, default=0.0)
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--kl-estimator", default="k3", choices=["k1", "k2", "k3"])
    p.add_argument("--kl-in-reward", action="store_true")
    p.add_argument("--advantage", default="group-norm",
                   choices=["group-norm", "group-mean", "rloo", "reinforce-pp-baseline"])
    p.add_argument("--float64", action="store_true")
    grad_parser = p
    p = sub.add_parser("grad-cases", help="grad once per line of CASES.jsonl ({\"out\": DIR, \"flags\": [...]}), "
                       "in one process")
    p.add_argument("dir")
    p.add_argument("batch")
    p.add_argument("cases")
    p = sub.add_parser("compare", help="one line per pair A B")
    p.add_argument("paths", nargs="+")
    args = parser.parse_args()
    if args.cmd == "grad-cases":
        for case in lines(args.cases):
            grad(grad_parser.parse_args([args.dir, args.batch, case["out"], *case["flags"]]))
        return
    {"make": make, "score": score, "generate": generate, "grad": grad, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
