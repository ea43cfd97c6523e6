"""The loss terms of docs/engines.md ("The formulas"), one function per term, as the native core
defines them (native/rl/trainer.cc: grpo_token, compute_gradients; native/model/moe.cc,
model.cc: the router losses). Token terms are computed in float64 from the float32 logits, as
the native code does; autograd gives the gradients the native code writes by hand."""

from dataclasses import dataclass

import torch


@dataclass
class LossConfig:
    """rl::LossConfig. Values are float32 numbers, as the native flags parse them."""

    objective: str  # "sft" or "grpo"
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aux_coef: float = 0.01
    z_coef: float = 0.001
    temperature: float = 1.0
    micro_batch: int = 64


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """logits [N,V] float32, targets [N]: (log p(target) [N], entropy [N], log p [N,V]) of
    softmax(logits / temperature), in float64."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    lp = logp.gather(1, targets[:, None])[:, 0]
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return lp, entropy


def grpo_token_terms(logits, targets, old_logprobs, ref_logprobs, advantages, lc: LossConfig):
    """Per completion token (grpo_token): ratio = exp(logp - logp_behaviour),
    policy = -min(ratio A, clip(ratio, 1-eps, 1+eps) A), k3 = exp(d) - d - 1 with
    d = logp_ref - logp, loss = policy + kl_coef k3 - entropy_coef H. old/ref/advantages are
    float64 tensors [N] (ref may be None when kl_coef is 0). Returns (loss, policy, kl, entropy,
    clipped), each [N]; `clipped` marks tokens whose clipped branch is the minimum, which get no
    policy gradient."""
    lp, entropy = token_logprobs(logits, targets, lc.temperature)
    ratio = torch.exp(lp - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - lc.clip_eps, 1.0 + lc.clip_eps)
    clipped = ratio * advantages > clipped_ratio * advantages
    policy = -torch.where(clipped, clipped_ratio.detach() * advantages, ratio * advantages)
    if lc.kl_coef != 0.0:
        d = ref_logprobs - lp
        kl = torch.exp(d) - d - 1.0
    else:
        kl = torch.zeros_like(lp)
    loss = policy + lc.kl_coef * kl - lc.entropy_coef * entropy
    return loss, policy, kl, entropy, clipped


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
