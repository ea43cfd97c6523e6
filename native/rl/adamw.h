// AdamW with global-norm gradient clipping and linear-warmup + cosine-decay learning rate.
// Dense gradients must already be summed over ranks; expert gradients stay sharded and
// their squared norm is summed over ranks here, so every rank clips by the same norm.
#pragma once

#include <cstdint>

#include "io/checkpoint.h"
#include "model/expert_comm.h"
#include "model/weights.h"

namespace moerl::rl {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled, matrices only (not norms)
  float grad_clip = 1.0f;     // max global L2 norm; <= 0 disables
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;    // cosine from lr to min_lr_ratio*lr over this many steps; 0 = constant
  float min_lr_ratio = 0.1f;
  int64_t schedule_start = 0;  // optimizer step at which warmup/decay begin (per training run)
};

// Learning rate for optimizer step `step` (0-based).
float lr_at(const AdamWConfig& c, int64_t step);

// Updates ps in place, advances opt.step; returns the global gradient norm before clipping.
float adamw_step(model::ParamStore& ps, io::OptimizerState& opt, const AdamWConfig& c,
                 model::ExpertComm& comm, float* lr_used = nullptr);

}  // namespace moerl::rl
