// The MoE feed-forward block: router -> top-k -> dispatch -> local SwiGLU experts -> combine.
// Dispatch/combine go through the EP core (ExpertComm), so the same code runs on 1 or R ranks.
// Backward mirrors forward: dispatch's backward is a combine along the cached routes and
// combine's backward is a dispatch along them.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/expert_comm.h"
#include "model/weights.h"

namespace moerl::model {

// Which tokens form which sequence, for the per-sequence balance loss. Token i belongs to
// sequence i / T and counts only if (i % T) < lengths[i / T]. lengths == nullptr: no aux loss.
struct SeqInfo {
  int B = 0, T = 0;
  const int32_t* lengths = nullptr;
};

struct MoeActs {
  // router side, [N,E] and [N,K]
  std::vector<float> logits, probs, lse;
  std::vector<int32_t> topk_idx;
  std::vector<float> topk_w;
  // expert side: received rows [Nr,C], their local expert ids / weights [Nr,K]
  Dispatched recv;
  // (row, slot) pairs grouped by local expert; expert i owns pairs [offsets[i], offsets[i+1])
  std::vector<int32_t> pair_row, pair_slot, offsets;
  std::vector<float> xin, h1, h3, act, y;  // [P,C] [P,F] [P,F] [P,F] [P,C]
  std::vector<float> recv_out;             // [Nr,C] weighted expert sum per received row
  // metrics from forward
  double aux_sum = 0.0;  // sum over sequences of E * sum_e f_e P_e
  double z_sum = 0.0;    // sum over valid tokens of logsumexp(router logits)^2
  std::vector<int64_t> expert_load;  // [E] (token, slot) assignments made by this rank
};

// Router and top-k of inp [N,C]: fills a.logits, a.probs, a.lse [N,E], a.topk_idx,
// a.topk_w [N,K] and a.expert_load [E]. Part of moe_forward; also the EP decode path's first
// step (moe_decode.h).
void moe_route(const float* inp, int N, const ModelConfig& cfg, const LayerWeights& lw,
               MoeActs& a);

// out [N,C] = MoE(inp [N,C]). Saves what backward needs into `a`.
void moe_forward(float* out, const float* inp, int N, const ModelConfig& cfg,
                 const LayerWeights& lw, const SeqInfo& seq, ExpertComm& comm, MoeActs& a);

// dinp [N,C] += d MoE / d inp; weight gradients into dlw. aux_weight multiplies the sum of
// per-sequence balance losses, z_weight the sum of per-token router z-losses.
void moe_backward(float* dinp, const LayerWeights& dlw, const float* dout, const float* inp,
                  int N, const ModelConfig& cfg, const LayerWeights& lw, const SeqInfo& seq,
                  float aux_weight, float z_weight, ExpertComm& comm, MoeActs& a);

}  // namespace moerl::model
