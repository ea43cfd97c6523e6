"""The loss terms against their formulas (docs/engines.md) written out by hand, gradients against
the native core's hand-written ones (grpo_token), and the balance loss against transformers'
load_balancing_loss_func."""

import unittest

import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from moerl_pytorch.losses import LossConfig, balance_loss, grpo_token_terms, router_stats, sft_token_terms

torch.manual_seed(0)


def native_grpo_dlogits(logits, target, old, ref, adv, lc, train=None):
    """d loss / d logits of one token as native/rl/trainer.cc grpo_token writes it."""
    z = logits.double() / lc.temperature
    p = torch.softmax(z, dim=-1)
    lp = torch.log(p[target])
    h = -(p * torch.log(p)).sum()
    w, ratio = 1.0, torch.exp(lp - old)
    if lc.tis_clip > 0:
        w, ratio = min(torch.exp(train - old), lc.tis_clip), torch.exp(lp - train)
    clipped = min(max(ratio, 1 - lc.clip_eps), 1 + lc.clip_eps)
    g_lp = 0.0 if ratio * adv > clipped * adv else -w * adv * ratio
    g_lp = g_lp + lc.kl_coef * (1.0 - torch.exp(ref - lp))
    onehot = torch.zeros_like(p)
    onehot[target] = 1.0
    dz = g_lp * (onehot - p) + lc.entropy_coef * p * (torch.log(p) + h)
    return dz / lc.temperature


class TokenTerms(unittest.TestCase):
    def test_grpo_terms_and_gradients_match_the_native_formulas(self):
        lc = LossConfig(objective="grpo", clip_eps=0.2, kl_coef=0.05, entropy_coef=0.01, temperature=0.9)
        N, V = 6, 11
        logits = torch.randn(N, V, requires_grad=True)
        targets = torch.randint(0, V, (N,))
        with torch.no_grad():
            lp_now = torch.log_softmax(logits.double() / lc.temperature, -1).gather(1, targets[:, None])[:, 0]
        # behaviour log-probs: on policy, and ratios below and above the clip range with
        # advantages of both signs (only the pessimistic branch's clipping counts)
        old = lp_now + torch.tensor([0.0, 0.5, -0.5, 0.01, 1.0, -1.0], dtype=torch.float64)
        ref = lp_now + 0.3
        adv = torch.tensor([1.0, 1.0, -1.0, -0.5, -2.0, 2.0], dtype=torch.float64)
        loss, policy, kl, entropy, clipped, mismatch, tis_clipped, train = grpo_token_terms(
            logits, targets, old, None, ref, adv, lc)
        # the first forward: the trainer's old log-probs are its own, rounded to float32
        torch.testing.assert_close(train, lp_now.float().double(), rtol=0, atol=0)
        d = train - old
        torch.testing.assert_close(mismatch, torch.exp(d) - 1 - d)
        self.assertFalse(tis_clipped.any())
        ratio = torch.exp(lp_now - old)
        want_policy = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
        torch.testing.assert_close(policy.detach(), want_policy)
        d = ref - lp_now
        torch.testing.assert_close(kl.detach(), torch.exp(d) - d - 1)
        self.assertEqual(clipped.tolist(), [False, False, False, False, True, True])
        loss.sum().backward()
        for i in range(N):
            want = native_grpo_dlogits(logits[i].detach(), targets[i], old[i], ref[i], adv[i], lc)
            torch.testing.assert_close(logits.grad[i].double(), want, rtol=1e-6, atol=1e-7)

    def test_tis_weights_the_policy_term_and_matches_the_native_gradients(self):
        lc = LossConfig(objective="grpo", clip_eps=0.2, kl_coef=0.05, entropy_coef=0.01, temperature=0.9,
                        tis_clip=2.0)
        N, V = 6, 11
        logits = torch.randn(N, V, requires_grad=True)
        targets = torch.randint(0, V, (N,))
        with torch.no_grad():
            lp_now = torch.log_softmax(logits.double() / lc.temperature, -1).gather(1, targets[:, None])[:, 0]
        # trainer's old log-probs near the current ones (ratios 1, clipped above and below);
        # rollout log-probs giving weights under the cap 2 and truncated ones (e^1.5 = 4.5)
        train = (lp_now + torch.tensor([0.0, 0.05, -0.5, 0.5, 0.0, -0.02], dtype=torch.float64)).float().double()
        old = train - torch.tensor([0.3, -0.4, 1.5, 0.1, 1.5, -2.0], dtype=torch.float64)
        ref = lp_now + 0.3
        adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -0.5, 2.0], dtype=torch.float64)
        t = grpo_token_terms(logits, targets, old, train, ref, adv, lc)
        w = torch.clamp(torch.exp(train - old), max=2.0)
        ratio = torch.exp(lp_now - train)
        want = -w * torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
        torch.testing.assert_close(t.policy.detach(), want)
        self.assertEqual(t.tis_clipped.tolist(), [False, False, True, False, True, False])
        self.assertEqual(t.clipped.tolist(), [False, False, True, True, False, False])
        torch.testing.assert_close(t.mismatch_kl, torch.exp(train - old) - 1 - (train - old))
        t.loss.sum().backward()
        for i in range(N):
            want = native_grpo_dlogits(logits[i].detach(), targets[i], old[i], ref[i], adv[i], lc, train[i])
            torch.testing.assert_close(logits.grad[i].double(), want, rtol=1e-6, atol=1e-7)

    def test_kl_estimators_and_clip_higher(self):
        N, V = 5, 7
        logits = torch.randn(N, V, requires_grad=True)
        targets = torch.randint(0, V, (N,))
        with torch.no_grad():
            lp = torch.log_softmax(logits.double(), -1).gather(1, targets[:, None])[:, 0]
        old = lp + torch.tensor([-0.2, -0.1, 0.0, 0.3, -0.5], dtype=torch.float64)  # ratios e^0.2 ...
        ref = lp + torch.tensor([0.2, -0.3, 0.1, 0.0, 0.5], dtype=torch.float64)
        adv = torch.ones(N, dtype=torch.float64)
        d = ref - lp
        for est, want in (("k1", -d), ("k2", 0.5 * d * d), ("k3", torch.exp(d) - d - 1)):
            lc = LossConfig(objective="grpo", kl_coef=0.1, kl_estimator=est, clip_high=0.28)
            t = grpo_token_terms(logits, targets, old, None, ref, adv, lc)
            torch.testing.assert_close(t.kl.detach(), want)
            # e^0.2 = 1.22 is within 1 + 0.28, e^0.5 = 1.65 beyond it
            self.assertEqual(t.clipped.tolist(), [False, False, False, False, True])
            logits.grad = None
            t.loss.sum().backward()
            g_kl = {"k1": torch.ones_like(d), "k2": -d, "k3": 1 - torch.exp(d)}[est]
            for i in range(N):
                p = torch.softmax(logits[i].detach().double(), -1)
                onehot = torch.nn.functional.one_hot(targets[i], V).double()
                ratio = torch.exp(lp[i] - old[i])
                g_lp = (0.0 if t.clipped[i] else -ratio) + 0.1 * g_kl[i]
                torch.testing.assert_close(logits.grad[i].double(), g_lp * (onehot - p), rtol=1e-6, atol=1e-7)

    def test_cispo_and_gspo_gradients_are_their_stop_gradient_forms(self):
        N, V = 4, 9
        logits = torch.randn(N, V, requires_grad=True)
        targets = torch.randint(0, V, (N,))
        with torch.no_grad():
            lp = torch.log_softmax(logits.double(), -1).gather(1, targets[:, None])[:, 0]
        old = lp + torch.tensor([0.1, -0.5, 0.5, 0.0], dtype=torch.float64)
        adv = torch.tensor([0.7, 0.7, -1.0, 1.0], dtype=torch.float64)
        p = torch.softmax(logits.detach().double(), -1)
        dlp = torch.nn.functional.one_hot(targets, V).double() - p  # d logp / d logits, per row
        lc = LossConfig(objective="grpo", policy_loss="cispo", clip_high=0.3)
        t = grpo_token_terms(logits, targets, old, None, None, adv, lc)
        weight = torch.clamp(torch.exp(lp - old), 0.8, 1.3)
        torch.testing.assert_close(t.policy.detach(), -weight * adv * lp)
        self.assertEqual(t.clipped.tolist(), [False, True, True, False])
        t.loss.sum().backward()
        torch.testing.assert_close(logits.grad.double(), (-weight * adv)[:, None] * dlp, rtol=1e-6, atol=1e-7)
        # GSPO: every token carries its sequence's ratio s; clipped beyond the range on the side
        # its advantage favours (s > 1 + 4e-4 with A > 0, s < 1 - 3e-4 with A < 0)
        logits.grad = None
        lc = LossConfig(objective="grpo", policy_loss="gspo", clip_eps=3e-4, clip_high=4e-4)
        seq = torch.tensor([1e-4, 1e-3, -1e-3, 1e-3], dtype=torch.float64)
        t = grpo_token_terms(logits, targets, old, None, None, adv, lc, seq)
        s = torch.exp(seq)
        self.assertEqual(t.clipped.tolist(), [False, True, True, True])
        t.loss.sum().backward()
        want = torch.where(t.clipped, torch.zeros_like(s), -adv * s)[:, None] * dlp
        torch.testing.assert_close(logits.grad.double(), want, rtol=1e-6, atol=1e-7)

    def test_sft_is_cross_entropy_at_temperature_one(self):
        logits = torch.randn(4, 9, requires_grad=True)
        targets = torch.tensor([0, 3, 8, 2])
        loss, entropy = sft_token_terms(logits, targets)
        torch.testing.assert_close(loss.float(), torch.nn.functional.cross_entropy(logits, targets, reduction="none"))
        self.assertFalse(entropy.requires_grad)


class RouterLosses(unittest.TestCase):
    def test_one_rank_balance_loss_is_transformers(self):
        E, K, B, T, L = 8, 2, 3, 5, 2
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1, 3:] = 0
        mask[2, 1:] = 0
        gates = [torch.randn(B * T, E, requires_grad=True) for _ in range(L)]
        rs = router_stats(gates, mask.reshape(-1).bool(), K)
        aux, term = balance_loss(rs.picks.sum(0), rs.prob_sum.detach(), rs.valid, rs.prob_sum)
        want = load_balancing_loss_func(tuple(gates), E, K, mask)
        self.assertAlmostEqual(aux, want.item(), places=6)
        self.assertAlmostEqual(term.item(), want.item(), places=6)
        term.backward()
        grads = [g.grad.clone() for g in gates]
        for g in gates:
            g.grad = None
        want.backward()
        for mine, theirs in zip(grads, gates):
            torch.testing.assert_close(mine, theirs.grad, rtol=1e-5, atol=1e-7)
        # z-loss: logsumexp^2 over valid tokens and layers
        valid = mask.reshape(-1).bool()
        z = sum((torch.logsumexp(g.detach().double()[valid], -1) ** 2).sum() for g in gates)
        self.assertAlmostEqual(rs.z_sum.item(), z.item(), places=9)
        self.assertEqual(rs.valid, float(valid.sum()) * L)

    def test_two_ranks_terms_add_up_to_the_one_rank_gradient(self):
        E, K, N = 4, 2, 10
        logits = torch.randn(N, E)
        valid = torch.ones(N, dtype=torch.bool)
        halves = [logits[:6].clone().requires_grad_(), logits[6:].clone().requires_grad_()]
        stats = [router_stats([h], valid[: h.shape[0]], K) for h in halves]
        picks = sum(s.picks.sum(0) for s in stats)
        probs = sum(s.prob_sum.detach() for s in stats)
        M = sum(s.valid for s in stats)
        for s in stats:
            aux, term = balance_loss(picks, probs, M, s.prob_sum)
            term.backward()
        whole = logits.clone().requires_grad_()
        rs = router_stats([whole], valid, K)
        aux1, term1 = balance_loss(rs.picks.sum(0), rs.prob_sum.detach(), rs.valid, rs.prob_sum)
        term1.backward()
        self.assertAlmostEqual(aux, aux1, places=9)
        torch.testing.assert_close(torch.cat([h.grad for h in halves]), whole.grad)


if __name__ == "__main__":
    unittest.main()
