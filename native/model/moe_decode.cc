// MoE decode blocks: normal mode (ExpertComm) and low-latency mode (ep::LowLatencyBuffer).
#include "model/moe_decode.h"

#include <algorithm>  // std::copy_n
#include <chrono>     // steady_clock for the time split

#include "common/check.h"
#include "model/ops.h"

namespace moerl::model {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Global OR through the communicator (sum of 0/1 in rank order); no traffic on one rank.
bool any_rank(transport::Communicator& comm, bool active, DecodeTimes& times) {
  auto t0 = std::chrono::steady_clock::now();
  float v = active ? 1.0f : 0.0f;
  comm.allreduce_sum(&v, 1);
  times.ep += seconds_since(t0);
  return v > 0.0f;
}

}  // namespace

void experts_forward(float* y, const float* x, const int64_t* offsets, int num_local_experts,
                     const ModelConfig& cfg, const LayerWeights& lw, MlpActs& scratch) {
  const int C = cfg.dim, F = cfg.expert_dim;
  for (int e = 0; e < num_local_experts; e++) {
    const size_t p0 = (size_t)offsets[e];
    const int n = (int)(offsets[e + 1] - offsets[e]);
    swiglu_mlp_forward(y + p0 * C, x + p0 * C, n, C, F, lw.experts[e], scratch);
  }
}

// ----------------------------------------------------------------------------
// normal mode

void NormalMoeDecode::forward(float* out, const float* inp, int n, const ModelConfig& cfg,
                              const LayerWeights& lw) {
  auto t0 = std::chrono::steady_clock::now();
  const double ep0 = comm_.stats.seconds;
  moe_forward(out, inp, n, cfg, lw, SeqInfo{}, comm_, acts_);
  const double ep = comm_.stats.seconds - ep0;
  times.ep += ep;
  times.experts += seconds_since(t0) - ep;
}

bool NormalMoeDecode::any(bool active) { return any_rank(comm_.communicator(), active, times); }

// ----------------------------------------------------------------------------
// low-latency mode

LowLatencyMoeDecode::LowLatencyMoeDecode(transport::Communicator& comm, const ModelConfig& cfg,
                                         int max_rows)
    : comm_(comm), max_rows_(max_rows) {
  ep::LowLatencyConfig c;
  c.num_max_dispatch_tokens_per_rank = max_rows;
  c.hidden = cfg.dim;
  c.num_experts = cfg.num_experts;
  c.num_topk = cfg.top_k;
  c.dispatch_dtype = ep::DType::F32;  // the policy's activations are fp32: no rounding on the wire
  buffer_ = std::make_unique<ep::LowLatencyBuffer>(comm, c);
}

void LowLatencyMoeDecode::forward(float* out, const float* inp, int n, const ModelConfig& cfg,
                                  const LayerWeights& lw) {
  const int C = cfg.dim;
  const int R = buffer_->num_ranks(), L = buffer_->num_local_experts(),
            P = buffer_->slot_capacity();
  auto t0 = std::chrono::steady_clock::now();
  moe_route(inp, n, cfg, lw, acts_);  // topk_idx, topk_w [n,K]
  idx64_.assign(acts_.topk_idx.begin(), acts_.topk_idx.end());
  times.experts += seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  buffer_->dispatch({inp, ep::DType::F32, n, C}, idx64_.data(), recv_);
  times.ep += seconds_since(t0);

  // slots (e, s) of one expert are R separate blocks: pack them so each expert is one GEMM
  t0 = std::chrono::steady_clock::now();
  const float* recv_x = static_cast<const float*>(recv_.recv_x);  // [L, R*P, C]
  offsets_.assign(L + 1, 0);
  for (int e = 0; e < L; e++) offsets_[e + 1] = offsets_[e] + recv_.num_recv_tokens_per_expert[e];
  const size_t Nr = (size_t)offsets_[L];
  xin_.resize(Nr * C);
  y_.resize(Nr * C);
  slot_y_.resize((size_t)L * R * P * C);
  for (int e = 0, row = 0; e < L; e++)
    for (int s = 0; s < R; s++) {
      const int count = recv_.recv_count[e * R + s];
      std::copy_n(recv_x + ((size_t)e * R * P + (size_t)s * P) * C, (size_t)count * C,
                  xin_.data() + (size_t)row * C);
      row += count;
    }
  experts_forward(y_.data(), xin_.data(), offsets_.data(), L, cfg, lw, mlp_acts_);
  for (int e = 0, row = 0; e < L; e++)
    for (int s = 0; s < R; s++) {
      const int count = recv_.recv_count[e * R + s];
      std::copy_n(y_.data() + (size_t)row * C, (size_t)count * C,
                  slot_y_.data() + ((size_t)e * R * P + (size_t)s * P) * C);
      row += count;
    }
  times.experts += seconds_since(t0);

  // out[t] = sum_k w[t,k] y[pair (t,k)], in k order
  t0 = std::chrono::steady_clock::now();
  buffer_->combine({slot_y_.data(), ep::DType::F32, (int64_t)L * R * P, C}, acts_.topk_w.data(),
                   combined_);
  std::copy_n(combined_.data<float>(), (size_t)n * C, out);
  times.ep += seconds_since(t0);
}

bool LowLatencyMoeDecode::any(bool active) { return any_rank(comm_, active, times); }

}  // namespace moerl::model
