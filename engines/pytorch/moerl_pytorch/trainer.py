"""One optimizer step over a global minibatch, data parallel (native/rl/trainer.cc:
compute_gradients, train_step, fill_ref_logprobs): every rank holds the same minibatch and takes
sequences i with i % R == rank in micro-batches; token losses are weighed by the aggregation
(losses.sequence_weights) from the step's global counts: its trained tokens (its completion
tokens less the loss masks' 0s) and its sequences with one; the router z-loss by its
global tokens, the balance loss is one per micro-batch of all ranks (its sums allreduced)
averaged over micro-batches; gradients are summed over ranks; then AdamW. Every rank runs the
same number of forwards, an empty share a one-token dummy that adds nothing, since FSDP2's
gathers and the balance sums are collectives."""

import time
from dataclasses import dataclass

import torch

from .batch import Sequence, micro_batches
from .errors import BadInput
from .hf import num_experts
from .losses import (LossConfig, balance_loss, grpo_token_terms, gspo_log_ratio, router_stats, sequence_weights,
                     sft_token_terms)
from .optim import AdamW
from .ranks import Group


@dataclass
class Packed:
    """A micro-batch right-padded to its longest sequence, and its trained completion positions
    (a loss mask's 0s, an environment's tokens, have no row: no loss reads them)."""

    input_ids: torch.Tensor  # [B,T]
    mask: torch.Tensor  # [B,T] 1 on real tokens
    rows_b: torch.Tensor  # [N] sequence of each trained completion position
    rows_t: torch.Tensor  # [N] position whose logits predict ...
    targets: torch.Tensor  # [N] ... this token
    old_logprobs: torch.Tensor  # [N] float64 (GRPO): the rollout's
    train_logprobs: torch.Tensor | None  # [N] float64 (GRPO): None on the first forward
    ref_logprobs: torch.Tensor | None  # [N] float64 (GRPO with KL)
    advantages: torch.Tensor  # [N] float64 (GRPO)
    dummy: bool  # an empty share's placeholder: nothing in it counts


def pack(seqs: list[Sequence], device: torch.device, with_ref: bool) -> Packed:
    dummy = not seqs
    if dummy:
        seqs = [Sequence(tokens=[0], prompt_len=1, ref_logprobs=[])]
    B, T = len(seqs), max(len(s.tokens) for s in seqs)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    rows_b, rows_t, targets, old, ref, adv, train = [], [], [], [], [], [], []
    # a micro-batch's sequences share their minibatch, so all or none had their first forward
    first = any(s.train_logprobs is None for s in seqs)
    for b, s in enumerate(seqs):
        ids[b, : len(s.tokens)] = torch.tensor(s.tokens)
        mask[b, : len(s.tokens)] = 1
        # completion token j is the target of position prompt_len - 1 + j
        trained = [j for j in range(s.completion_len) if s.trained(j)]
        rows_b += [b] * len(trained)
        rows_t += [s.prompt_len - 1 + j for j in trained]
        targets += [s.tokens[s.prompt_len + j] for j in trained]
        adv += [s.advantage] * len(trained)
        if s.old_logprobs:  # SFT has no behaviour log-probs to pick from
            old += [s.old_logprobs[j] for j in trained]
        if not first:
            train += [s.train_logprobs[j] for j in trained]
        if with_ref:
            ref += [s.ref_logprobs[j] for j in trained]
    f64 = dict(dtype=torch.float64, device=device)
    return Packed(
        input_ids=ids.to(device), mask=mask.to(device),
        rows_b=torch.tensor(rows_b, dtype=torch.long, device=device),
        rows_t=torch.tensor(rows_t, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        old_logprobs=torch.tensor(old, **f64), train_logprobs=None if first else torch.tensor(train, **f64),
        ref_logprobs=torch.tensor(ref, **f64) if with_ref else None,
        advantages=torch.tensor(adv, **f64), dummy=dummy)


def forward(model, p: Packed):
    """(logits [B,T,V] float32, router logits per MoE layer [B*T,E])."""
    out = model(input_ids=p.input_ids, attention_mask=p.mask, output_router_logits=True, use_cache=False)
    return out.logits, out.router_logits


@dataclass
class StepMetrics:
    loss: float = 0.0
    policy_loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_frac: float = 0.0
    mismatch_kl: float = 0.0
    tis_clip_frac: float = 0.0
    aux_loss: float = 0.0
    z_loss: float = 0.0
    grad_norm: float = 0.0
    lr: float = 0.0
    tokens: float = 0.0
    sequences: float = 0.0
    seconds: float = 0.0
    expert_load: list | None = None  # [E] fraction of (token, slot) picks per expert, all layers
    expert_load_layers: list | None = None  # [L][E] the same per layer (dense layers: zeros)


# metric sums, one float64 vector allreduced at the end of the step
LOSS, POLICY, KL, ENTROPY, CLIP, MISMATCH, TIS_CLIP, AUX, Z, NUM = range(10)


def compute_gradients(model, moe_layer_ids: list[int], num_layers: int, batch: list[Sequence],
                      lc: LossConfig, group: Group, progress=None) -> StepMetrics:
    """Gradients of the step's loss in p.grad (summed over ranks) and the step's metrics but
    grad_norm and lr. GRPO: fills train_logprobs of this rank's sequences that have none. Every
    rank checks the whole batch before its first collective, so bad input fails all alike."""
    t0 = time.perf_counter()
    device = group.device
    for i, s in enumerate(batch):
        check_loss_mask(s, i)
    n_tok = float(sum(s.trained_tokens for s in batch))
    n_seq = float(sum(1 for s in batch if s.trained_tokens > 0))
    if n_tok == 0:
        raise BadInput(f"training batch of {len(batch)} sequences has no trained token "
                       f"(every completion token is masked)")
    n_valid = float(sum(len(s.tokens) for s in batch))
    L_moe = len(moe_layer_ids)
    top_k = model.config.num_experts_per_tok
    mbs = micro_batches(len(batch), group.rank, group.world_size, lc.micro_batch)
    aux_weight = lc.aux_coef / len(mbs)
    z_weight = lc.z_coef / (n_valid * L_moe)
    grpo = lc.objective == "grpo"
    with_ref = grpo and lc.kl_coef != 0.0
    E = num_experts(model.config)
    sums = torch.zeros(NUM + num_layers * E, dtype=torch.float64)
    for p in model.parameters():
        p.grad = None
    for k, ids in enumerate(mbs):
        seqs = [batch[i] for i in ids]
        pk = pack(seqs, device, with_ref)
        logits, router_logits = forward(model, pk)
        rows = logits[pk.rows_b, pk.rows_t]
        trained = torch.tensor([s.trained_tokens for s in seqs] if not pk.dummy else [0], device=device)
        weight = (sequence_weights(lc, trained, n_tok, n_seq) if grpo
                  else torch.full(trained.shape, 1.0 / n_tok, dtype=torch.float64, device=device))[pk.rows_b]
        if grpo:
            seq_log_ratio = (gspo_log_ratio(rows, pk.targets, pk.old_logprobs, pk.train_logprobs, pk.rows_b,
                                            len(trained), lc) if lc.policy_loss == "gspo" else None)
            t = grpo_token_terms(rows, pk.targets, pk.old_logprobs, pk.train_logprobs, pk.ref_logprobs,
                                 pk.advantages, lc, seq_log_ratio)
            tok_loss, entropy = t.loss, t.entropy
            sums[POLICY] += float(t.policy.detach().sum())
            sums[KL] += float(t.kl.detach().sum())
            sums[CLIP] += float(t.clipped.sum())
            sums[MISMATCH] += float(t.mismatch_kl.sum())
            sums[TIS_CLIP] += float(t.tis_clipped.sum())
            if pk.train_logprobs is None:
                split_completions(seqs, t.train_logprobs.cpu().tolist(), "train_logprobs")
        else:
            tok_loss, entropy = sft_token_terms(rows, pk.targets)
        sums[LOSS] += float((tok_loss.detach() * weight).sum())
        sums[ENTROPY] += float(entropy.detach().sum())
        valid = pk.mask.reshape(-1).bool() if not pk.dummy else torch.zeros_like(pk.mask.reshape(-1)).bool()
        rs = router_stats(router_logits, valid, top_k)
        reduced = group.all_reduce_sum(torch.cat([
            rs.picks.sum(dim=0).cpu(), rs.prob_sum.detach().cpu(), torch.tensor([rs.valid], dtype=torch.float64)]))
        aux, aux_term = balance_loss(reduced[:E].to(device), reduced[E:2 * E].to(device), float(reduced[2 * E]),
                                     rs.prob_sum)
        if group.rank == 0:  # the same value on every rank: counted once
            sums[AUX] += aux
        sums[Z] += float(rs.z_sum.detach())
        for j, layer in enumerate(moe_layer_ids):
            sums[NUM + layer * E: NUM + (layer + 1) * E] += rs.picks[j].cpu()
        loss = (tok_loss * weight).sum() + aux_weight * aux_term + z_weight * rs.z_sum
        if pk.dummy:
            loss = loss + 0.0 * logits.sum()
        loss.backward()
        if progress:
            progress(k + 1, len(mbs))
    group.all_reduce_sum(sums)
    m = StepMetrics(tokens=n_tok, sequences=float(len(batch)))
    m.aux_loss = float(sums[AUX]) / len(mbs)
    m.z_loss = float(sums[Z]) / (n_valid * L_moe)
    m.policy_loss = float(sums[POLICY]) / n_tok
    m.kl = float(sums[KL]) / n_tok
    m.entropy = float(sums[ENTROPY]) / n_tok
    m.clip_frac = float(sums[CLIP]) / n_tok
    m.mismatch_kl = float(sums[MISMATCH]) / n_tok
    m.tis_clip_frac = float(sums[TIS_CLIP]) / n_tok
    m.loss = float(sums[LOSS]) + lc.aux_coef * m.aux_loss + lc.z_coef * m.z_loss
    load = sums[NUM:].reshape(num_layers, E)
    m.expert_load = (load.sum(0) / max(1.0, float(load.sum()))).tolist()
    m.expert_load_layers = [(row / max(1.0, float(row.sum()))).tolist() for row in load]
    m.seconds = time.perf_counter() - t0
    return m


def train_step(model, moe_layer_ids, num_layers, optimizer: AdamW, batch, lc, group: Group,
               progress=None) -> StepMetrics:
    """compute_gradients, then one AdamW step."""
    t0 = time.perf_counter()
    m = compute_gradients(model, moe_layer_ids, num_layers, batch, lc, group, progress)
    sq = group.all_reduce_sum(torch.tensor([optimizer.grad_sq_sum()], dtype=torch.float64))
    m.grad_norm, m.lr = optimizer.apply(float(sq[0]))
    m.seconds = time.perf_counter() - t0
    return m


def check_loss_mask(s: Sequence, i: int) -> None:
    if s.loss_mask is not None and len(s.loss_mask) != s.completion_len:
        raise BadInput(f"sequence {i}: loss mask of {len(s.loss_mask)} entries for {s.completion_len} "
                       f"completion tokens")


def split_completions(seqs: list[Sequence], values: list[float], name: str) -> None:
    """Per-token values of a packed micro-batch's trained positions, in order, onto each
    sequence's completion, 0.0 at its masked positions (which had no row), so that the list
    lines up with the completion as the native train_logprobs and ref_logprobs do."""
    start = 0
    for s in seqs:
        per_token = []
        for j in range(s.completion_len):
            if s.trained(j):
                per_token.append(values[start])
                start += 1
            else:
                per_token.append(0.0)
        setattr(s, name, per_token)


@torch.no_grad()
def fill_ref_logprobs(model, batch: list[Sequence], lc: LossConfig, group: Group, progress=None) -> None:
    """Per-token log-probs of each completion under `model` (the reference policy) at the
    sampling temperature, float32 values (0.0 at a loss mask's 0s, which no loss reads), for
    this rank's share of the minibatch: exactly the share train_step gives it."""
    for i, s in enumerate(batch):
        check_loss_mask(s, i)
    mbs = micro_batches(len(batch), group.rank, group.world_size, lc.micro_batch)
    for k, ids in enumerate(mbs):
        seqs = [batch[i] for i in ids]
        pk = pack(seqs, group.device, False)
        logits, _ = forward(model, pk)
        lp = torch.log_softmax(logits[pk.rows_b, pk.rows_t].double() / lc.temperature, dim=-1)
        split_completions(seqs, lp.gather(1, pk.targets[:, None])[:, 0].float().cpu().tolist(), "ref_logprobs")
        if progress:
            progress(k + 1, len(mbs))
