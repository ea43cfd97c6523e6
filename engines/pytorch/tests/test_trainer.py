"""The loss mask of multi-turn episodes on a tiny MoE model, one rank on the CPU, as the native
LossMask tests (native/tests/rl_test.cc) check it: the summed gradient (the step's gradient
times its trained tokens) is linear in the mask, an all-ones mask trains bitwise as no mask, a
masked token's id never reaches a gradient it does not feed as input, the metrics count trained
tokens and the per-completion log-probs hold 0 at masked positions."""

import json
import os
import tempfile
import unittest

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from moerl_pytorch.batch import Sequence, grpo_batch, read_rewards, read_rollouts
from moerl_pytorch.contract import RankContract
from moerl_pytorch.errors import BadInput
from moerl_pytorch.hf import moe_layers
from moerl_pytorch.losses import LossConfig
from moerl_pytorch.optim import AdamW, AdamWConfig
from moerl_pytorch.ranks import Group
from moerl_pytorch.trainer import compute_gradients, fill_ref_logprobs, train_step

VOCAB = 29
COMPLETION = 6


def tiny_model(seed=7):
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=32, tie_word_embeddings=False,
        initializer_range=0.2, bos_token_id=None, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 2)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # routers far from uniform: no top-k choice is a near tie
        for name, p in model.named_parameters():
            if name.endswith("gate.weight") and p.dim() == 2 and p.shape[0] < 16:
                p.normal_(0.0, 1.0)
    return model.eval()


def batch(mask):
    """Two sequences in one micro-batch, of a 3- and a 2-token prompt (the second padded) and a
    6-token completion each, the same loss mask on both."""
    out = []
    for i, prompt in enumerate((3, 2)):
        tokens = [(t * 5 + i * 3 + 1) % VOCAB for t in range(prompt + COMPLETION)]
        out.append(Sequence(tokens=tokens, prompt_len=prompt,
                            old_logprobs=[-2.0 - 0.1 * j for j in range(COMPLETION)],
                            advantage=0.7 if i == 0 else -0.4, loss_mask=None if mask is None else list(mask)))
    return out


class LossMask(unittest.TestCase):
    """Each test runs for SFT and GRPO (with KL, so the reference log-probs are read)."""

    def setUp(self):
        self.model = tiny_model()
        self.moe = moe_layers(self.model)
        self.group = Group(RankContract(), torch.device("cpu"))
        self.ref = tiny_model(seed=8)

    def configs(self):
        # the router losses do not depend on the mask: off, so the gradient is the tokens' alone
        for objective in ("sft", "grpo"):
            yield LossConfig(objective=objective, kl_coef=0.1 if objective == "grpo" else 0.0, entropy_coef=0.01,
                             aux_coef=0.0, z_coef=0.0, micro_batch=4)

    def gradients(self, seqs, lc):
        """(every parameter's gradient, concatenated, times the step's trained tokens; metrics)."""
        if lc.kl_coef != 0.0:
            fill_ref_logprobs(self.ref, seqs, lc, self.group)
        m = compute_gradients(self.model, self.moe, len(self.model.model.layers), seqs, lc, self.group)
        g = torch.cat([p.grad.reshape(-1).double() for p in self.model.parameters()])
        return g * m.tokens, m

    def test_the_summed_gradient_is_linear_in_the_mask(self):
        policy, env = [1, 1, 0, 0, 0, 1], [0, 0, 1, 1, 1, 0]
        for lc in self.configs():
            with self.subTest(objective=lc.objective):
                whole, _ = self.gradients(batch(None), lc)
                a, _ = self.gradients(batch(policy), lc)
                b, _ = self.gradients(batch(env), lc)
                scale = float(whole.abs().max())
                self.assertGreater(scale, 1e-3)
                # G(mask) + G(1 - mask) = G(all)
                self.assertLess(float((a + b - whole).abs().max()), 1e-5 * scale)
                # and the masked tokens contributed nothing to G(mask)
                self.assertGreater(float((a - whole).abs().max()), 1e-3 * scale)

    def test_an_all_ones_mask_is_bitwise_no_mask(self):
        for lc in self.configs():
            with self.subTest(objective=lc.objective):
                plain, pm = self.gradients(batch(None), lc)
                ones, om = self.gradients(batch([1] * COMPLETION), lc)
                self.assertTrue(torch.equal(plain, ones))
                self.assertEqual((pm.loss, pm.entropy, pm.kl, pm.tokens), (om.loss, om.entropy, om.kl, om.tokens))

    def test_a_masked_last_token_does_not_reach_the_gradient(self):
        """Up to rounding, not bitwise as natively: the new id routes the last position to other
        experts, and transformers' experts run their tokens as one GEMM each, whose other rows
        then round differently (by about 1e-7 of the largest entry here). Trained, the same
        change moves the gradient by orders of magnitude more."""

        def change_last(seqs):
            for s in seqs:
                s.tokens[-1] = (s.tokens[-1] + 4) % VOCAB
            return seqs

        mask = [1, 1, 1, 1, 1, 0]
        for lc in self.configs():
            with self.subTest(objective=lc.objective):
                before, m = self.gradients(batch(mask), lc)
                self.assertEqual(m.tokens, 2 * 5)  # trained tokens, not completion tokens
                after, _ = self.gradients(change_last(batch(mask)), lc)
                scale = float(before.abs().max())
                self.assertLess(float((after - before).abs().max()), 1e-5 * scale)
                trained, _ = self.gradients(change_last(batch(None)), lc)
                plain, _ = self.gradients(batch(None), lc)
                self.assertGreater(float((trained - plain).abs().max()), 1e-2 * scale)

    def test_masked_positions_hold_zero_log_probs(self):
        lc = list(self.configs())[1]
        plain, masked = batch(None), batch([1, 0, 1, 1, 0, 1])
        for seqs in (plain, masked):
            self.gradients(seqs, lc)
        for p, s in zip(plain, masked):
            for name in ("train_logprobs", "ref_logprobs"):
                got, want = getattr(s, name), getattr(p, name)
                self.assertEqual(len(got), COMPLETION)
                self.assertEqual([got[1], got[4]], [0.0, 0.0])
                # the trained positions' values are the unmasked sequence's
                self.assertEqual([got[j] for j in (0, 2, 3, 5)], [want[j] for j in (0, 2, 3, 5)])
                self.assertNotIn(0.0, want)

    def test_bad_masks_are_bad_input(self):
        lc = list(self.configs())[0]
        with self.assertRaisesRegex(BadInput, r"^sequence 0: loss mask of 3 entries for 6 completion tokens$"):
            self.gradients(batch([1, 1, 0]), lc)
        with self.assertRaisesRegex(BadInput, r"^training batch of 2 sequences has no trained token"):
            self.gradients(batch([0] * COMPLETION), lc)


class RolloutsLossMask(unittest.TestCase):
    """A rollout line's "loss_mask" reaches the GRPO step (as ToolsTest.GrpoTakesTheRolloutsLossMask):
    all ones trains exactly as no mask, a mask with zeros trains differently."""

    def step_on(self, bit):
        d = tempfile.mkdtemp()
        rollouts, rewards = os.path.join(d, "r.jsonl"), os.path.join(d, "w.jsonl")
        with open(rollouts, "w") as f, open(rewards, "w") as w:
            for k in range(4):
                tokens = [(3 * k + 2 * t + 1) % VOCAB for t in range(5)]
                line = {"prompt_id": 0, "sample_index": k, "prompt": "", "prompt_tokens": [4, 9, k + 1],
                        "tokens": tokens, "text": "", "logprobs": [-1.5 - 0.2 * t for t in range(5)],
                        "finish_reason": "length"}
                if bit is not None:
                    line["loss_mask"] = [bit(t) for t in range(5)]
                f.write(json.dumps(line) + "\n")
                w.write(json.dumps({"prompt_id": 0, "sample_index": k, "reward": float(k % 2)}) + "\n")
        seqs = grpo_batch(read_rollouts(rollouts), read_rewards([rewards])).sequences
        model = tiny_model()
        params = dict(model.named_parameters())
        lc = LossConfig(objective="grpo", micro_batch=3)
        m = train_step(model, moe_layers(model), len(model.model.layers), AdamW(params, AdamWConfig(lr=1e-2)),
                       seqs, lc, Group(RankContract(), torch.device("cpu")))
        return {n: p.detach().clone() for n, p in params.items()}, m

    def test_all_ones_trains_as_no_mask_and_zeros_train_differently(self):
        plain, pm = self.step_on(None)
        ones, om = self.step_on(lambda t: 1)
        half, hm = self.step_on(lambda t: t % 2)
        self.assertTrue(all(torch.equal(plain[n], ones[n]) for n in plain))
        self.assertEqual((pm.tokens, om.tokens, hm.tokens), (20.0, 20.0, 8.0))
        self.assertFalse(all(torch.equal(plain[n], half[n]) for n in plain))


if __name__ == "__main__":
    unittest.main()
