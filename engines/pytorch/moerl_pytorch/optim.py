"""AdamW with global-norm clipping and linear warmup + cosine decay, element for element the
native update (native/rl/adamw.cc: lr_at, adamw_step): float32 arithmetic in the same order,
bias corrections folded into two scalars, decoupled weight decay on matrices only. It works
on each rank's local shard of every parameter (FSDP2 DTensors or plain tensors)."""

import math
from dataclasses import dataclass

import numpy as np
import torch

f32 = np.float32


@dataclass
class AdamWConfig:
    """rl::AdamWConfig; every value a float32 number as the native flags parse them."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max global L2 norm; <= 0 disables
    warmup_steps: int = 0
    decay_steps: int = 0  # cosine from lr to min_lr_ratio * lr over this many steps; 0 = constant
    min_lr_ratio: float = 0.1
    schedule_start: int = 0  # optimizer step at which warmup and decay begin


def lr_at(c: AdamWConfig, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based), in float32 as lr_at."""
    if step < c.warmup_steps:
        return float(f32(c.lr) * f32(step + 1) / f32(c.warmup_steps))
    if c.decay_steps <= 0:
        return float(f32(c.lr))
    t = min(1.0, (step - c.warmup_steps) / c.decay_steps)
    ratio = float(f32(c.min_lr_ratio)) + (1.0 - float(f32(c.min_lr_ratio))) * 0.5 * (1.0 + math.cos(math.pi * t))
    return float(f32(float(f32(c.lr)) * ratio))


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class AdamW:
    """Moments m, v per parameter (local shards), one step counter for all."""

    def __init__(self, params: dict[str, torch.nn.Parameter], config: AdamWConfig):
        self.params = params
        self.config = config
        self.step = 0
        self.m = {n: torch.zeros_like(local(p)) for n, p in params.items()}
        self.v = {n: torch.zeros_like(local(p)) for n, p in params.items()}

    def grad_sq_sum(self) -> float:
        """Sum of squared gradients of this rank's shards, accumulated in float64."""
        total = 0.0
        for p in self.params.values():
            if p.grad is not None:
                total += float(local(p.grad).double().square().sum())
        return total

    @torch.no_grad()
    def apply(self, grad_sq_sum_all: float) -> tuple[float, float]:
        """One update from the gradients in p.grad; grad_sq_sum_all is grad_sq_sum() summed over
        ranks. Returns (global gradient norm before clipping, learning rate used)."""
        c = self.config
        norm = f32(math.sqrt(grad_sq_sum_all))
        scale = f32(c.grad_clip) / norm if c.grad_clip > 0 and norm > f32(c.grad_clip) else f32(1.0)
        lr = f32(lr_at(c, max(0, self.step - c.schedule_start)))
        self.step += 1
        bc1 = f32(1.0) - f32(c.beta1) ** f32(self.step)
        bc2 = f32(1.0) - f32(c.beta2) ** f32(self.step)
        step_size, inv_sqrt_bc2 = lr / bc1, f32(1.0) / np.sqrt(bc2)
        b1, b2 = f32(c.beta1), f32(c.beta2)
        a1, a2 = f32(1.0) - b1, f32(1.0) - b2
        for name, p in self.params.items():
            if p.grad is None:
                continue
            decay = f32(c.weight_decay) if p.dim() >= 2 else f32(0.0)
            shrink = f32(1.0) - lr * decay
            w, g = local(p), local(p.grad)
            m, v = self.m[name], self.v[name]
            gi = g * float(scale)
            m.mul_(float(b1)).add_(gi * float(a1))
            v.mul_(float(b2)).add_(gi * float(a2) * gi)
            w.mul_(float(shrink)).sub_(m * float(step_size) / (v.sqrt() * float(inv_sqrt_bc2) + float(f32(c.eps))))
        return float(norm), float(lr)
