"""AdamW and its schedule: lr_at's warmup and cosine values, one step against torch.optim.AdamW
(the same update up to float32 rounding) and the global-norm clip."""

import math
import unittest

import torch

from moerl_pytorch.optim import AdamW, AdamWConfig, lr_at


class Schedule(unittest.TestCase):
    def test_warmup_then_cosine_to_the_floor(self):
        c = AdamWConfig(lr=1e-3, warmup_steps=4, decay_steps=10, min_lr_ratio=0.1)
        want = {0: 0.25e-3, 3: 1e-3, 4: 1e-3, 9: 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))), 100: 1e-4}
        for step, lr in want.items():  # float32 values, as the native lr_at returns
            self.assertAlmostEqual(lr_at(c, step) / lr, 1.0, places=6)
        self.assertAlmostEqual(lr_at(AdamWConfig(lr=2e-3), 50) / 2e-3, 1.0, places=6)


class Step(unittest.TestCase):
    def params(self):
        torch.manual_seed(1)
        w = {"w": torch.nn.Parameter(torch.randn(5, 3)), "norm": torch.nn.Parameter(torch.randn(3))}
        for p in w.values():
            p.grad = torch.randn_like(p) * 0.1
        return w

    def test_matches_torch_adamw_with_decay_on_matrices_only(self):
        mine, ref = self.params(), self.params()
        c = AdamWConfig(lr=1e-2, weight_decay=0.1, grad_clip=0.0)
        opt = AdamW(mine, c)
        groups = [{"params": [ref["w"]], "weight_decay": 0.1}, {"params": [ref["norm"]], "weight_decay": 0.0}]
        torch_opt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
        for _ in range(3):
            norm, lr = opt.apply(opt.grad_sq_sum())
            torch_opt.step()
        self.assertEqual(opt.step, 3)
        for k in mine:
            torch.testing.assert_close(mine[k].data, ref[k].data, rtol=1e-6, atol=1e-7)

    def test_clips_by_the_global_norm(self):
        w = self.params()
        sq = sum(float(p.grad.double().square().sum()) for p in w.values())
        opt = AdamW(w, AdamWConfig(grad_clip=0.01))
        norm, _ = opt.apply(sq)
        self.assertAlmostEqual(norm, math.sqrt(sq), places=5)
        # the first moment holds (1 - beta1) * g * clip / norm
        g = self.params()["w"].grad
        torch.testing.assert_close(opt.m["w"], 0.1 * g * (0.01 / norm), rtol=1e-5, atol=1e-9)


if __name__ == "__main__":
    unittest.main()
