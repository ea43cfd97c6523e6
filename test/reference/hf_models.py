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
                    [--entropy-coef H] [--temperature T]
      The loss moerl's trainer defines (docs/native-model.md), by torch autograd over the whole
      batch in one forward: gradients saved as a model (save_pretrained: the on-disk tensor
      names) in OUT_DIR, and {"loss":...} printed.
  hf_models.py compare A B
      Two safetensors files or HF directories, tensor by tensor: {"tensors":n, "missing":[names in
      one only], "bitwise":bool (same dtype, shape and bytes), "max_rel_l2":x, "worst":name}.
"""
import argparse
import json
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


def load(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="eager")
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


def grad(args):
    model = load(args.dir)
    model.train()  # no dropout in these models; router noise is off
    rows = lines(args.batch)
    B, T = len(rows), max(len(r["tokens"]) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r["tokens"])] = torch.tensor(r["tokens"])
        mask[b, :len(r["tokens"])] = 1
    out = model(ids, attention_mask=mask, output_router_logits=True)
    tau = args.temperature if args.loss == "grpo" else 1.0
    logp = torch.log_softmax(out.logits / tau, dim=-1)
    n_tok = sum(len(r["tokens"]) - r["prompt_len"] for r in rows)
    total = 0.0
    for b, r in enumerate(rows):
        for t in range(r["prompt_len"] - 1, len(r["tokens"]) - 1):
            target = r["tokens"][t + 1]
            lp = logp[b, t, target]
            if args.loss == "sft":
                total = total - lp
                continue
            j = t + 1 - r["prompt_len"]
            ratio = torch.exp(lp - r["old_logprobs"][j])
            a = r["advantage"]
            policy = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - args.clip_eps, 1 + args.clip_eps) * a)
            entropy = -(logp[b, t].exp() * logp[b, t]).sum()
            total = total + policy - args.entropy_coef * entropy
    loss = total / n_tok + args.aux_coef * out.aux_loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.grad)
    model.save_pretrained(args.out_dir)
    print(json.dumps({"loss": loss.item(), "aux_loss": out.aux_loss.item()}))


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
    a, b = tensors(args.a), tensors(args.b)
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
    p.add_argument("--entropy-coef", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    args = parser.parse_args()
    {"make": make, "score": score, "generate": generate, "grad": grad, "compare": compare}[args.cmd](args)


if __name__ == "__main__":
    main()
