// AdamW update.
#include "rl/adamw.h"

#include <algorithm>  // std::min
#include <cmath>      // std::sqrt, std::cos, std::pow

namespace moerl::rl {
namespace {

void update(float* p, const float* g, float* m, float* v, size_t n, float lr, float scale,
            float decay, const AdamWConfig& c, float bc1, float bc2) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * scale;
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * gi;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * gi * gi;
    float mhat = m[i] / bc1, vhat = v[i] / bc2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + c.eps) + decay * p[i]);
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
