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

// Activations of a dense SwiGLU MLP over n rows: h1 = w1 x, h3 = w3 x [n,F], act = silu(h1) h3.
struct MlpActs {
  std::vector<float> h1, h3, act;
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
  std::vector<float> xin, y;               // [P,C] [P,C]
  std::vector<MlpActs> expert_acts;        // per local expert, its pairs' rows
  std::vector<float> recv_out;             // [Nr,C] weighted expert sum per received row
  // metrics from forward
  double aux_sum = 0.0;  // sum over sequences of E * sum_e f_e P_e (BalanceLoss::Sequence)
  double z_sum = 0.0;    // sum over valid tokens of logsumexp(router logits)^2
  std::vector<int64_t> expert_load;  // [E] (token, slot) assignments made by this rank
  // BalanceLoss::Batch: this layer's sums over valid tokens, [E] picks and probabilities (the
  // model adds them over layers and ranks), and the gradient of the batch loss with respect to
  // each valid token's router probability of expert e, [E], which the model sets before backward
  std::vector<double> pick_count, prob_sum;
  double valid_tokens = 0.0;
  std::vector<float> balance_grad;
};

// y [n,C] = w2 (silu(w1 x) * (w3 x)) for x [n,C] with F = hidden width: one expert, or a dense
// layer's MLP. Fills acts for backward.
void swiglu_mlp_forward(float* y, const float* x, int n, int C, int F, const ExpertWeights& w,
                        MlpActs& acts);
// dx [n,C] += d/dx, weight gradients into dw.
void swiglu_mlp_backward(float* dx, const ExpertWeights& dw, const float* dy, const float* x, int n,
                         int C, int F, const ExpertWeights& w, const MlpActs& acts);

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
