// Single-process reference for the low-latency mode (ep/low_latency.h), over the inputs of
// ep_reference.h: plain loops over (source rank, token, top-k slot), nothing shared with ep/.
#pragma once

#include <cstdint>
#include <vector>

#include "ep/dtype.h"
#include "ep_reference.h"

namespace moerl::ep::testing {

// The pairs (source rank, token) rank `dest` must hold in slot (local expert e, source s),
// in token order: slots[e * R + s].
inline std::vector<std::vector<int64_t>> expected_ll_slots(const Case& c,
                                                           const std::vector<RankInputs>& all,
                                                           int dest) {
  const int R = c.world_size, L = c.num_experts / R, K = c.num_topk;
  std::vector<std::vector<int64_t>> slots(size_t(L) * R);
  for (int s = 0; s < R; ++s)
    for (int64_t t = 0; t < all[size_t(s)].num_tokens; ++t)
      for (int k = 0; k < K; ++k) {
        const topk_idx_t e = all[size_t(s)].topk_idx[size_t(t * K + k)];
        if (e >= 0 && e / L == dest) slots[size_t((e % L) * R + s)].push_back(t);
      }
  return slots;
}

// The test's expert step: expert e (global id) multiplies its row by this.
inline float ll_expert_scale(int64_t expert) { return 1.0f + 0.125f * float(expert % 7); }

// Channel ch of token t's payload as the expert sees it in fp32 (fp8: dequantized).
inline float ll_payload(const Case& c, const RankInputs& in, int64_t t, int64_t ch) {
  const int64_t C = c.hidden;
  if (c.dtype == DType::F32) return in.x_f32[size_t(t * C + ch)];
  if (c.dtype == DType::BF16)
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(in.x.data())[t * C + ch]);
  return fp8_e4m3_to_f32(in.x[size_t(t * C + ch)]) * in.x_scales[size_t(t * (C / 128) + ch / 128)];
}

// Expert output value of (token t, expert e), rounded to bf16 when the payload is bf16.
inline float ll_expert_output(const Case& c, const RankInputs& in, int64_t t, int64_t ch,
                              int64_t e) {
  const float v = ll_payload(c, in, t, ch) * ll_expert_scale(e);
  return c.dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

// combine at the source: out[t] = sum over k = 0..K-1 of w[t,k] * output, from 0, fp32.
inline std::vector<float> expected_ll_combine(const Case& c, const RankInputs& in,
                                              bool use_weights) {
  const int K = c.num_topk;
  const int64_t C = c.hidden;
  std::vector<float> out(size_t(in.num_tokens * C), 0.0f);
  for (int64_t t = 0; t < in.num_tokens; ++t)
    for (int k = 0; k < K; ++k) {
      const topk_idx_t e = in.topk_idx[size_t(t * K + k)];
      if (e < 0) continue;
      const float w = use_weights ? in.topk_weights[size_t(t * K + k)] : 1.0f;
      for (int64_t ch = 0; ch < C; ++ch) {
        const float product = w * ll_expert_output(c, in, t, ch, e);
        out[size_t(t * C + ch)] += product;
      }
    }
  return out;
}

}  // namespace moerl::ep::testing
