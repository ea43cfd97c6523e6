// AdamW update.
#include "rl/adamw.h"

#include <algorithm>  // std::min
#include <cmath>      // std::sqrt, std::cos, std::pow

namespace moerl::rl {
namespace {

void update(float* p, const float* g, float* m, float* v, size_t n, float lr, float scale,
            float decay, const AdamWConfig& c, float bc1, float bc2) {
  // Bias corrections folded into two scalars: one sqrt and one divide per element.
  const float step_size = lr / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  const float b1 = c.beta1, b2 = c.beta2, a1 = 1.0f - c.beta1, a2 = 1.0f - c.beta2;
  const float eps = c.eps, shrink = 1.0f - lr * decay;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * scale;
    float mi = b1 * m[i] + a1 * gi;
    float vi = b2 * v[i] + a2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * shrink - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

float lr_at(const AdamWConfig& c, int64_t step) {
  if (step < c.warmup_steps) return c.lr * (float)(step + 1) / (float)c.warmup_steps;
  if (c.decay_steps <= 0) return c.lr;
  double t = std::min(1.0, (double)(step - c.warmup_steps) / (double)c.decay_steps);
  double ratio = c.min_lr_ratio + (1.0 - c.min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * t));
  return (float)(c.lr * ratio);
}

float adamw_step(model::ParamStore& ps, io::OptimizerState& opt, const AdamWConfig& c,
                 model::ExpertComm& comm, float* lr_used) {
  double sq_dense = 0.0, sq_experts = 0.0;
  for (float g : ps.grad_dense) sq_dense += (double)g * g;
  for (float g : ps.grad_experts) sq_experts += (double)g * g;
  float sq = (float)sq_experts;
  comm.allreduce_sum(&sq, 1);
  float norm = (float)std::sqrt(sq_dense + sq);
  float scale = (c.grad_clip > 0.0f && norm > c.grad_clip) ? c.grad_clip / norm : 1.0f;
  float lr = lr_at(c, std::max<int64_t>(0, opt.step - c.schedule_start));
  opt.step++;
  float bc1 = 1.0f - std::pow(c.beta1, (float)opt.step);
  float bc2 = 1.0f - std::pow(c.beta2, (float)opt.step);
  const model::ParamLayout& l = ps.layout;
  for (const model::TensorSpec& s : l.dense) {
    float decay = s.shape.size() == 2 ? c.weight_decay : 0.0f;
    update(ps.dense.data() + s.offset, ps.grad_dense.data() + s.offset, opt.m_dense.data() + s.offset,
           opt.v_dense.data() + s.offset, s.numel, lr, scale, decay, c, bc1, bc2);
  }
  for (const model::TensorSpec& s : l.experts)
    update(ps.experts.data() + s.offset, ps.grad_experts.data() + s.offset,
           opt.m_experts.data() + s.offset, opt.v_experts.data() + s.offset, s.numel, lr, scale,
           c.weight_decay, c, bc1, bc2);
  if (lr_used) *lr_used = lr;
  return norm;
}

}  // namespace moerl::rl
