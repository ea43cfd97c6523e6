// The MoE policy: token + position embedding, L x (RMSNorm -> causal MHA -> residual,
// RMSNorm -> MoE -> residual), final RMSNorm, LM head. Training forward/backward over a
// right-padded batch [B,T]; the sampler (sampler.h) has its own KV-cached decode path.
#pragma once

#include <cstdint>
#include <vector>

#include "model/expert_comm.h"
#include "model/moe.h"
#include "model/weights.h"

namespace moerl::model {

struct LayerActs {
  std::vector<float> resid;          // [N,C] input of the layer
  std::vector<float> ln1, ln1_rstd;  // [N,C] [N]
  std::vector<float> qkv;            // [N,3C]
  std::vector<float> att_probs;      // [B,H,T,T]
  std::vector<float> att;            // [N,C]
  std::vector<float> mid;            // [N,C] residual after attention
  std::vector<float> ln2, ln2_rstd;  // [N,C] [N]
  MoeActs moe;
};

struct Activations {
  int B = 0, T = 0;
  std::vector<int32_t> tokens, positions, lengths;
  std::vector<LayerActs> layers;
  std::vector<float> resid_final;      // [N,C]
  std::vector<float> lnf, lnf_rstd;    // [N,C] [N]
  std::vector<float> logits;           // [N,V]
  double aux_sum = 0.0, z_sum = 0.0;   // summed over layers
  std::vector<int64_t> expert_load;    // [E] summed over layers
};

// tokens [B,T] right-padded, lengths [B] valid tokens per sequence. Fills a.logits [B*T,V].
void model_forward(ParamStore& ps, ExpertComm& comm, const int32_t* tokens,
                   const int32_t* lengths, int B, int T, Activations& a);

// Adds gradients of  sum(dlogits . logits) + aux_weight * aux_sum + z_weight * z_sum  into ps.dw.
void model_backward(ParamStore& ps, ExpertComm& comm, const float* dlogits, float aux_weight,
                    float z_weight, Activations& a);

// Matmul FLOPs of one forward over N tokens in sequences of length T (attention included),
// counting the experts actually applied (N*K). Backward is twice this.
double forward_flops(const ModelConfig& cfg, int B, int T);

}  // namespace moerl::model
