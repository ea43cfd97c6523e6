// The MoE policy: token (+ learned position) embedding, L x (RMSNorm -> causal attention with
// optional q/k-norm and RoPE -> residual, RMSNorm -> MoE or dense MLP -> residual), final
// RMSNorm, LM head. Training forward/backward over a
// right-padded batch [B,T]; the sampler (sampler.h) has its own KV-cached decode path.
#pragma once

#include <cstdint>
#include <vector>

#include "model/expert_comm.h"
#include "model/moe.h"
#include "model/weights.h"

namespace moerl::model {

// Widths as in weights.h: W = qkv_width, Q = q_width, Hq = H + Hkv heads of q and k.
struct LayerActs {
  std::vector<float> resid;          // [N,C] input of the layer
  std::vector<float> ln1, ln1_rstd;  // [N,C] [N]
  std::vector<float> qkv_raw;        // [N,W] before q/k-norm (qk_norm only)
  std::vector<float> qk_rstd;        // [N,Hq] per-head rstd of the q/k-norm (qk_norm only)
  std::vector<float> qkv;            // [N,W] attention's input: q/k normed and rotated
  std::vector<float> att_probs;      // [B,H,T,T]
  std::vector<float> att;            // [N,Q]
  std::vector<float> mid;            // [N,C] residual after attention
  std::vector<float> ln2, ln2_rstd;  // [N,C] [N]
  MoeActs moe;                       // MoE layers (dense layers: zero expert_load only)
  MlpActs mlp;                       // dense layers
};

struct Activations {
  int B = 0, T = 0;
  std::vector<int32_t> tokens, positions, lengths;
  std::vector<LayerActs> layers;
  std::vector<float> resid_final;      // [N,C]
  std::vector<float> lnf, lnf_rstd;    // [N,C] [N]
  bool all_logit_rows = true;          // logits of every row, or of logit_rows only:
  std::vector<int32_t> logit_rows;     //   [M] rows of [N]
  std::vector<float> lnf_rows;         //   [M,C] their lnf rows, the LM head's input
  std::vector<float> logits;           // [M,V] (M = N for all rows)
  double aux_sum = 0.0, z_sum = 0.0;   // summed over MoE layers (BalanceLoss::Batch: aux_sum
                                       //   is the batch loss of all ranks, the same on each)
  std::vector<int64_t> expert_load;    // [E] summed over layers
};

// tokens [B,T] right-padded, lengths [B] valid tokens per sequence. Fills a.logits [M,V] for
// the M rows of [B*T] that logit_rows names (the positions a loss or the sampler reads: the LM
// head is the largest GEMM, and a prompt's positions need none), or for all B*T rows when it is
// null.
void model_forward(ParamStore& ps, ExpertComm& comm, const int32_t* tokens,
                   const int32_t* lengths, int B, int T, Activations& a,
                   const std::vector<int32_t>* logit_rows = nullptr);

// Adds gradients of  sum(dlogits . logits) + aux_weight * aux_sum + z_weight * z_sum  into ps.dw;
// dlogits [M,V] has the rows of a.logits and may be a.logits itself (a loss that turned each
// row of logits into its gradient in place).
void model_backward(ParamStore& ps, ExpertComm& comm, const float* dlogits, float aux_weight,
                    float z_weight, Activations& a);

// q/k-norm (ModelConfig::qk_norm) of N rows qkv_raw [N,W] into qkv: RMSNorm over D of each of
// the H q heads (weight q_norm) and the Hkv k heads (k_norm), v copied; rstd [N,H+Hkv]. The
// training forward and the sampler's decode step share it.
void qk_norm_forward(float* qkv, float* rstd, const float* qkv_raw, const LayerWeights& lw, int N,
                     const ModelConfig& cfg);
// dqkv_raw [N,W] += the gradient through qk_norm_forward of dqkv; q_norm/k_norm gradients into dlw.
void qk_norm_backward(float* dqkv_raw, const LayerWeights& dlw, const float* dqkv,
                      const float* qkv_raw, const float* rstd, const LayerWeights& lw, int N,
                      const ModelConfig& cfg);

// Matmul FLOPs of one forward over N tokens in sequences of length T (attention included),
// counting the experts actually applied (N*K). Backward is twice this.
double forward_flops(const ModelConfig& cfg, int B, int T);

}  // namespace moerl::model
