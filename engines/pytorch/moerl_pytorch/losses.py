"""The loss terms of docs/engines.md ("The formulas") and docs/algorithms.md, one function per
term, as the native core defines them (native/rl/trainer.cc: grpo_token, compute_gradients;
native/model/moe.cc, model.cc: the router losses). Token terms are computed in float64 from the float32 logits, as
the native code does; autograd gives the gradients the native code writes by hand."""

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass
class LossConfig:
    """rl::LossConfig. Values are float32 numbers, as the native flags parse them."""

    objective: str  # "sft" or "grpo"
    policy_loss: str = "ppo-clip"  # algorithms.POLICY_LOSSES
    aggregation: str = "token-mean"  # algorithms.AGGREGATIONS
    kl_estimator: str = "k3"  # algorithms.KL_ESTIMATORS
    clip_eps: float = 0.2  # ratio clip below, 1 - clip_eps
    clip_high: float = 0.2  # ratio clip above, 1 + clip_high
    norm_tokens: float = 0.0  # seq-mean-token-sum-norm's constant
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aux_coef: float = 0.01
    z_coef: float = 0.001
    temperature: float = 1.0
    tis_clip: float = 0.0  # truncated importance sampling cap C; 0 = off
    micro_batch: int = 64


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """logits [N,V] float32, targets [N]: (log p(target) [N], entropy [N], log p [N,V]) of
    softmax(logits / temperature), in float64."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    lp = logp.gather(1, targets[:, None])[:, 0]
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return lp, entropy


class GrpoTerms(NamedTuple):
    """Per completion token, each [N]."""

    loss: torch.Tensor
    policy: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clipped: torch.Tensor  # the clipped branch is the minimum: no policy gradient
    mismatch_kl: torch.Tensor  # k3 of KL(rollout || trainer)
    tis_clipped: torch.Tensor  # the importance weight is truncated at tis_clip
    train_logprobs: torch.Tensor  # the trainer's old log-probs used (float32 values, float64)


def grpo_token_terms(logits, targets, old_logprobs, train_logprobs, ref_logprobs, advantages,
                     lc: LossConfig, seq_log_ratio=None) -> GrpoTerms:
    """Per completion token (grpo_token): w = min(exp(logp_train - logp_rollout), tis_clip)
    (detached) and logp_old = logp_train with TIS; w = 1 and logp_old = logp_rollout without.
    ppo-clip: r = exp(logp - logp_old), policy = -w min(r A, clip(r, 1-eps, 1+eps_high) A);
    gspo: the same with r = s exp(logp - sg(logp)), s = exp(seq_log_ratio) the sequence's ratio
    (detached, [N] per token); cispo: policy = -w sg(clip(r, 1-eps, 1+eps_high)) A logp.
    KL to the reference by lc.kl_estimator of d = logp_ref - logp (k1 -d, k2 d^2/2, k3
    e^d - d - 1); loss = policy + kl_coef kl - entropy_coef H; mismatch_kl = expm1(m) - m with
    m = logp_train - logp_rollout. old (the rollout's), train, ref and advantages are float64
    tensors [N]; train is None on the tokens' first forward (their own log-probs, rounded to
    float32, are used) and ref None when kl_coef is 0."""
    lp, entropy = token_logprobs(logits, targets, lc.temperature)
    train = lp.detach().float().double() if train_logprobs is None else train_logprobs
    d_mis = train - old_logprobs
    mismatch_kl = torch.expm1(d_mis) - d_mis
    if lc.tis_clip > 0.0:
        raw = torch.exp(d_mis)
        tis_clipped = raw > lc.tis_clip
        w = torch.clamp(raw, max=lc.tis_clip)
        old = train
    else:
        tis_clipped = torch.zeros_like(lp, dtype=torch.bool)
        w = torch.ones_like(d_mis)
        old = old_logprobs
    lo, hi = 1.0 - lc.clip_eps, 1.0 + lc.clip_high
    if lc.policy_loss == "cispo":
        ratio = torch.exp(lp.detach() - old)
        weight = torch.clamp(ratio, lo, hi)
        clipped = weight != ratio
        policy = -w * weight * advantages * lp
    else:
        if lc.policy_loss == "gspo":
            ratio = torch.exp(seq_log_ratio) * torch.exp(lp - lp.detach())
        else:
            ratio = torch.exp(lp - old)
        clipped_ratio = torch.clamp(ratio.detach(), lo, hi)
        clipped = ratio.detach() * advantages > clipped_ratio * advantages
        policy = -w * torch.where(clipped, clipped_ratio * advantages, ratio * advantages)
    if lc.kl_coef != 0.0:
        d = ref_logprobs - lp
        kl = {"k1": lambda: -d, "k2": lambda: 0.5 * d * d, "k3": lambda: torch.exp(d) - d - 1.0}[lc.kl_estimator]()
    else:
        kl = torch.zeros_like(lp)
    loss = policy + lc.kl_coef * kl - lc.entropy_coef * entropy
    return GrpoTerms(loss, policy, kl, entropy, clipped, mismatch_kl, tis_clipped, train)


def gspo_log_ratio(logits, targets, old_logprobs, train_logprobs, rows_b, num_seqs: int, lc: LossConfig):
    """GSPO's log sequence ratio per token [N] (compute_gradients' gspo_log_ratio): the mean over
    its sequence's trained tokens of logp - logp_old, detached; 0 on a first forward with TIS."""
    if lc.tis_clip > 0.0 and train_logprobs is None:
        return torch.zeros_like(old_logprobs)
    with torch.no_grad():
        lp, _ = token_logprobs(logits, targets, lc.temperature)
    old = train_logprobs if lc.tis_clip > 0.0 else old_logprobs
    sums = torch.zeros(num_seqs, dtype=torch.float64, device=lp.device).index_add_(0, rows_b, lp - old)
    counts = torch.bincount(rows_b, minlength=num_seqs).clamp(min=1)
    return (sums / counts)[rows_b]


def sequence_weights(lc: LossConfig, trained: torch.Tensor, n_tok: float, n_seq: float) -> torch.Tensor:
    """compute_gradients' sequence_weight: each token loss's weight in the step's loss by its
    sequence's trained tokens [B] (lc.aggregation), given the minibatch's trained tokens and its
    sequences with at least one."""
    t = trained.double()
    if lc.aggregation == "token-mean":
        return torch.full_like(t, 1.0 / n_tok)
    if lc.aggregation == "seq-mean-token-sum":
        return torch.full_like(t, 1.0 / n_seq)
    if lc.aggregation == "seq-mean-token-mean":
        return torch.where(t > 0, 1.0 / (n_seq * t.clamp(min=1)), torch.zeros_like(t))
    return torch.full_like(t, 1.0 / (n_seq * lc.norm_tokens))


def sft_token_terms(logits, targets):
    """Per completion token: loss = -log p(target) at temperature 1; entropy for the metrics only."""
    lp, entropy = token_logprobs(logits, targets, 1.0)
    return -lp, entropy.detach()


@dataclass
class RouterStats:
    """One forward's router sums over its valid tokens (padding excluded), MoE layers only."""

    picks: torch.Tensor  # [L_moe, E] float64: top-k picks of each expert (no gradient)
    prob_sum: torch.Tensor  # [E] float64: router probabilities summed over tokens and layers
    valid: float  # valid tokens times MoE layers: M of the balance loss
    z_sum: torch.Tensor  # float64: sum over tokens and layers of logsumexp(router logits)^2


def router_stats(router_logits, valid: torch.Tensor, top_k: int) -> RouterStats:
    """router_logits: per MoE layer [N,E] (the router's raw logits, all N = B*T rows); valid [N]
    bool. Probabilities are softmax in float32 (as transformers' router and the native core),
    top-k by probability; the sums are float64."""
    picks, prob_sum, z_sum = [], 0.0, 0.0
    n_valid = int(valid.sum())
    for logits in router_logits:
        logits = logits[valid]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        E = probs.shape[-1]
        idx = torch.topk(probs.detach(), top_k, dim=-1).indices
        picks.append(torch.bincount(idx.reshape(-1), minlength=E).double())
        prob_sum = prob_sum + probs.double().sum(dim=0)
        z_sum = z_sum + (torch.logsumexp(logits.double(), dim=-1) ** 2).sum()
    return RouterStats(torch.stack(picks), prob_sum, float(n_valid * len(router_logits)), z_sum)


def balance_loss(picks_all: torch.Tensor, prob_sum_all: torch.Tensor, valid_all: float,
                 prob_sum_local: torch.Tensor):
    """transformers' load_balancing_loss_func over one micro-batch of every rank:
    aux = E sum_e (c_e / M)(S_e / M), c_e the picks of expert e, S_e the sum of its router
    probabilities, M the valid tokens, all summed over MoE layers and ranks (the *_all
    arguments, allreduced). Returns (aux, the term whose gradient is this rank's share:
    E sum_e c_e S_e_local / M^2, so d/dp = E c_e / M^2 as in the native core)."""
    E = picks_all.shape[-1]
    if valid_all <= 0:
        return 0.0, prob_sum_local.sum() * 0.0
    scale = E / (valid_all * valid_all)
    aux = scale * float((picks_all * prob_sum_all).sum())
    return aux, scale * (picks_all * prob_sum_local).sum()
