#!/usr/bin/env python3
"""The engine's gradients of one step's loss, for the tests that hold them against a reference
(test/integration/algorithm-reference.test.ts), as `moe_hf score --grad-out` gives the native
core's:

  grad.py DIR BATCH.jsonl CASES.jsonl

one case per line {"out": OUT_DIR, "flags": [trainer flags of `grpo`]}, all in one process.

BATCH.jsonl has moe_hf score's GRPO lines: "tokens", "prompt_len", "old_logprobs", "group" and
"reward" (advantages by --advantage through batch.group_advantages, a group of equal rewards
left out), "ref_logprobs" with --kl-coef (and --kl-in-reward), an optional "loss_mask". One rank, every sequence in one
micro-batch (trainer.compute_gradients); the gradients are saved as a model under the on-disk
tensor names in OUT_DIR, and {"loss":...} printed."""

import argparse
import json

import numpy as np
import torch

from moerl_pytorch.algorithms import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from moerl_pytorch.batch import Sequence, group_advantages, json_lines, loss_mask_field, sequence_kl
from moerl_pytorch.contract import RankContract
from moerl_pytorch.hfdir import HfDir
from moerl_pytorch.losses import LossConfig
from moerl_pytorch.ranks import Group
from moerl_pytorch.runner import Policy
from moerl_pytorch.trainer import compute_gradients


def f32(values) -> list[float]:
    return [float(np.float32(v)) for v in values]


def batch(path: str, estimator: str, kl_penalty: float, kl_estimator: str) -> list[Sequence]:
    seqs, groups = [], {}
    for what, row in json_lines(path):
        prompt_len = row["prompt_len"]
        s = Sequence(tokens=row["tokens"], prompt_len=prompt_len, old_logprobs=f32(row["old_logprobs"]),
                     ref_logprobs=f32(row["ref_logprobs"]) if "ref_logprobs" in row else None,
                     loss_mask=loss_mask_field(row, len(row["tokens"]) - prompt_len, what))
        reward = float(np.float32(row["reward"]))
        if kl_penalty:  # --kl-in-reward, as grpo_batch's penalties
            reward = float(np.float32(reward - kl_penalty * float(np.float32(sequence_kl(s, kl_estimator)))))
        groups.setdefault(row["group"], []).append((s, reward))
    members = list(groups.values())
    advantages = group_advantages([[r for _, r in g] for g in members],
                                  [[s.trained_tokens for s, _ in g] for g in members], estimator)
    for g, adv in zip(members, advantages):
        for (s, _), a in zip(g, adv or []):
            s.advantage = a
            seqs.append(s)
    return seqs


def main() -> None:
    cases = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cases.add_argument("dir")
    cases.add_argument("batch")
    cases.add_argument("cases")
    c = cases.parse_args()
    for _, case in json_lines(c.cases):
        gradients(c.dir, c.batch, case["out"], case["flags"])


def gradients(model_dir: str, batch_path: str, out_dir: str, flags: list[str]) -> None:
    p = argparse.ArgumentParser(prog="grad.py case flags")
    p.add_argument("--policy-loss", choices=POLICY_LOSSES, default="ppo-clip")
    p.add_argument("--aggregation", choices=AGGREGATIONS, default="token-mean")
    p.add_argument("--kl-estimator", choices=KL_ESTIMATORS, default="k3")
    p.add_argument("--advantage", choices=ADVANTAGE_ESTIMATORS, default="group-norm")
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--clip-high", type=float, default=None)
    p.add_argument("--norm-tokens", type=float, default=0.0)
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--kl-in-reward", action="store_true")
    p.add_argument("--entropy-coef", type=float, default=0.0)
    p.add_argument("--aux-coef", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=1.0)
    a = p.parse_args(flags)
    kl_coef = float(np.float32(a.kl_coef))
    seqs = batch(batch_path, a.advantage, kl_coef if a.kl_in_reward else 0.0, a.kl_estimator)
    lc = LossConfig(objective="grpo", policy_loss=a.policy_loss, aggregation=a.aggregation,
                    kl_estimator=a.kl_estimator, clip_eps=float(np.float32(a.clip_eps)),
                    clip_high=float(np.float32(a.clip_eps if a.clip_high is None else a.clip_high)),
                    norm_tokens=float(np.float32(a.norm_tokens)), kl_coef=0.0 if a.kl_in_reward else kl_coef,
                    entropy_coef=float(np.float32(a.entropy_coef)), aux_coef=float(np.float32(a.aux_coef)),
                    z_coef=0.0, temperature=float(np.float32(a.temperature)), micro_batch=len(seqs))
    policy = Policy(HfDir(model_dir, "DIR"), torch.device("cpu"), "eager")
    m = compute_gradients(policy.model, policy.moe_layer_ids, policy.num_layers, seqs, lc,
                          Group(RankContract(), torch.device("cpu")))
    grads = {n: q.grad if q.grad is not None else torch.zeros_like(q) for n, q in policy.model.named_parameters()}
    policy.model.save_pretrained(out_dir, state_dict=grads, safe_serialization=True)
    print(json.dumps({"loss": m.loss, "aux_loss": m.aux_loss}))


if __name__ == "__main__":
    main()
