"""The torch side of a run, once cli.py has read and checked every input: load the policy (and
the reference policy), form the group, shard, train the steps `moe_train grpo|sft` would take,
write the HF directory."""

import math

import numpy as np
import torch

from .batch import GrpoBatch, Sequence, minibatches, sequence_kl, sft_step_batch
from .contract import RankContract
from .hf import load_model, moe_layers, read_optimizer_state, save_hf
from .hfdir import HfDir
from .losses import LossConfig
from .optim import AdamW, AdamWConfig
from .ranks import Group, distribute_like, full_tensor, pick_device, shard_model
from .trainer import fill_ref_logprobs, train_step


class Policy:
    """The policy being trained: the model (sharded over the ranks above one), its MoE layers
    and the AdamW state, loaded from an HF directory and its optimizer.moerl when it has one
    (else Adam starts from zero moments at step 0, as after `moe_train init --from-hf`)."""

    def __init__(self, d: HfDir, device, attn: str):
        self.dir = d
        self.model = load_model(d, device, attn)
        self.moe_layer_ids = moe_layers(self.model)
        self.num_layers = len(self.model.model.layers)
        shapes = {n: tuple(p.shape) for n, p in self.model.named_parameters()}
        self.step, self.state = read_optimizer_state(d, shapes)
        self.optimizer = None

    def shard(self, group: Group, adamw: AdamWConfig) -> None:
        """After the group formed: FSDP2 above one rank, then AdamW on the local shards."""
        if group.sharded:
            shard_model(self.model)
        params = dict(self.model.named_parameters())
        self.optimizer = AdamW(params, adamw)
        self.optimizer.step = self.step
        if self.state is not None:
            for n, p in params.items():
                self.optimizer.m[n].copy_(distribute_like(self.state[f"m.{n}"], p))
                self.optimizer.v[n].copy_(distribute_like(self.state[f"v.{n}"], p))
            self.state = None

    def train_step(self, batch: list[Sequence], lc: LossConfig, group: Group, progress):
        return train_step(self.model, self.moe_layer_ids, self.num_layers, self.optimizer, batch, lc, group,
                          progress)

    def save(self, out: str, group: Group, max_shard_bytes: int) -> None:
        """Collective: every rank gathers the full tensors, rank 0 writes the directory."""
        weights, moments = {}, {}
        for n, p in self.model.named_parameters():
            weights[n] = full_tensor(p)
            moments[f"m.{n}"] = full_tensor(as_dtensor(self.optimizer.m[n], p))
            moments[f"v.{n}"] = full_tensor(as_dtensor(self.optimizer.v[n], p))
        if group.rank == 0:
            save_hf(self.model, weights, self.dir, out, max_shard_bytes, moments, self.optimizer.step)


def as_dtensor(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A local shard as a DTensor placed as `like` (or the tensor itself)."""
    if hasattr(like, "device_mesh"):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, like.device_mesh, like.placements, shape=like.shape,
                                  stride=like.stride())
    return local


def adamw_config(a, schedule_start: int) -> AdamWConfig:
    return AdamWConfig(lr=a.lr, beta2=a.beta2, weight_decay=a.weight_decay, grad_clip=a.grad_clip,
                       warmup_steps=a.warmup_steps, decay_steps=a.decay_steps, min_lr_ratio=a.min_lr_ratio,
                       schedule_start=schedule_start)


def finite(x):
    """JSON has no NaN or infinity: null, as the native json_float writes them."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def metrics_line(m, step: int, extra: dict) -> dict:
    line = {"step": step, "loss": m.loss, "policy_loss": m.policy_loss, "kl": m.kl, "entropy": m.entropy,
            "clip_frac": m.clip_frac, "mismatch_kl": m.mismatch_kl, "tis_clip_frac": m.tis_clip_frac,
            "aux_loss": m.aux_loss, "z_loss": m.z_loss, "grad_norm": m.grad_norm, "lr": m.lr, "tokens": m.tokens,
            "sequences": m.sequences, "seconds": m.seconds, "tokens_per_s": m.tokens / max(m.seconds, 1e-9)}
    line = {k: finite(v) for k, v in line.items()}
    line["expert_load"] = [finite(x) for x in m.expert_load]
    line["expert_load_layers"] = [[finite(x) for x in row] for row in m.expert_load_layers]
    return {**line, **extra}


def reward_kl_penalties(ref, scored: list[tuple[tuple[int, int], Sequence]], a, lc: LossConfig, group: Group, out):
    """--kl-in-reward (moe_train's sample_kls): each sample's KL to the reference, this rank's
    share scored and the float32 sums allreduced; the penalties kl-coef x KL by (prompt id,
    sample index), and the KL per trained token (the reward_kl metric)."""
    seqs = [s for _, s in scored]
    if seqs:
        fill_ref_logprobs(ref, seqs, lc, group, out.step_progress("ref_logprobs", 0, 1))
    kl = torch.tensor([float(np.float32(sequence_kl(s, a.kl_estimator))) if s.ref_logprobs is not None else 0.0
                       for s in seqs], dtype=torch.float64)
    kl = group.all_reduce_sum(kl).tolist()
    penalties = {key: a.kl_coef * k for (key, _), k in zip(scored, kl)}
    return penalties, sum(kl) / max(1, sum(s.trained_tokens for s in seqs))


def run_grpo(a, contract: RankContract, out, batch: GrpoBatch, policy_dir: HfDir, ref_dir: HfDir | None,
             scored: list[tuple[tuple[int, int], Sequence]], rebatch) -> int:
    lc = LossConfig(objective="grpo", policy_loss=a.policy_loss, aggregation=a.aggregation,
                    kl_estimator=a.kl_estimator, clip_eps=a.clip_eps, clip_high=a.clip_high,
                    norm_tokens=a.norm_tokens, kl_coef=0.0 if a.kl_in_reward else a.kl_coef,
                    entropy_coef=a.entropy_coef, aux_coef=a.aux_coef, z_coef=a.z_coef, temperature=a.temperature,
                    tis_clip=a.tis_clip, micro_batch=a.micro_batch)
    device = pick_device(a.device, contract.rank)
    policy = Policy(policy_dir, device, a.attn_implementation)
    ref = load_model(ref_dir, device, a.attn_implementation) if ref_dir and (batch.sequences or scored) else None
    group = Group(contract, device)
    try:
        # GRPO's schedule counts the optimizer's whole life (moe_train grpo: schedule_start 0)
        policy.shard(group, adamw_config(a, schedule_start=0))
        if ref is not None and group.sharded:
            shard_model(ref)
        reward_kl = {}
        if a.kl_in_reward:
            penalties, reward_kl["reward_kl"] = reward_kl_penalties(ref, scored, a, lc, group, out)
            batch = rebatch(penalties)
        mbs = minibatches(batch.sequences, a.minibatches)
        if ref is not None and not a.kl_in_reward:
            for m, mb in enumerate(mbs):
                if mb:
                    fill_ref_logprobs(ref, mb, lc, group, out.step_progress("ref_logprobs", m, a.minibatches))
            del ref
        if not batch.sequences:
            out.line({"iteration": a.iteration, "skipped": True, "mean_reward": batch.mean_reward,
                      "groups": batch.groups}, True)
        extra = {"iteration": a.iteration, "mean_reward": batch.mean_reward, "groups": batch.groups,
                 "skipped_groups": batch.skipped_groups, "overlong_filtered": batch.overlong_filtered, **reward_kl}
        steps, step = sum(a.epochs for mb in mbs if mb), 0
        for _ in range(a.epochs if batch.sequences else 0):
            for mb in mbs:
                if mb:
                    m = policy.train_step(mb, lc, group, out.step_progress("grpo", step, steps))
                    out.line(metrics_line(m, step, extra), True)
                    step += 1
        policy.save(a.out, group, a.max_shard_bytes)
        group.finish()
    finally:
        group.close()
    return 0


def run_sft(a, contract: RankContract, out, examples: list[Sequence], policy_dir: HfDir) -> int:
    lc = LossConfig(objective="sft", aux_coef=a.aux_coef, z_coef=a.z_coef, micro_batch=a.micro_batch)
    if a.decay_steps is None:
        a.decay_steps = a.steps
    device = pick_device(a.device, contract.rank)
    policy = Policy(policy_dir, device, a.attn_implementation)
    group = Group(contract, device)
    try:
        # SFT's warmup and decay start at this run's first step (moe_train sft: schedule_start)
        policy.shard(group, adamw_config(a, schedule_start=policy.step))
        for step in range(a.steps):
            batch = sft_step_batch(examples, step, a.batch_size, a.first_prompt)
            m = policy.train_step(batch, lc, group, out.step_progress("sft", step, a.steps))
            out.line(metrics_line(m, step, {}), True)
        policy.save(a.out, group, a.max_shard_bytes)
        group.finish()
    finally:
        group.close()
    return 0
