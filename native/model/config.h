// Shape of the MoE policy. One struct travels through checkpoints, tools and tests.
//
// One set of ops serves every family: moerl's own architecture (learned positions, MHA,
// renormalised top-k, a sequence-wise balance loss) is the default of every field, and the
// Hugging Face families are configurations of the same code (io/hf.h maps their config.json
// and tensor names): grouped-query attention with an explicit head width, RoPE in the
// rotate-half convention, per-head q/k RMSNorm, dense SwiGLU layers among the MoE layers, tied
// embeddings, top-k weights left unnormalised, transformers' batch-wise balance loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moerl::model {

// How the load-balancing loss counts.
enum class BalanceLoss {
  Sequence,  // moerl: per sequence E * sum_e f_e P_e, summed over sequences and MoE layers
  Batch,     // transformers' load_balancing_loss_func: one E * sum_e f_e P_e over every valid
             //   token of every MoE layer of the forward batch (all ranks together)
};

struct ModelConfig {
  int vocab_size = 0;   // V
  int max_seq_len = 0;  // T_max: rows of the position embedding / of the KV cache
  int dim = 0;          // C
  int num_layers = 0;   // L
  int num_heads = 0;    // H
  int num_experts = 0;  // E, divisible by the EP world size
  int top_k = 0;        // K <= E
  int expert_dim = 0;   // F, hidden width of each SwiGLU expert
  float norm_eps = 1e-5f;
  // Hugging Face families; the defaults are moerl's architecture.
  int num_kv_heads = 0;         // Hkv, divides H (grouped-query attention); 0 = H
  int head_dim = 0;             // D; 0 = C / H
  float rope_theta = 0.0f;      // > 0: RoPE with this base and no position embedding;
                                //   0: a learned position embedding wpe [T_max,C]
  bool qk_norm = false;         // RMSNorm over head_dim of every q and k head, before RoPE
  bool norm_topk_prob = true;   // renormalise the top-k router probabilities to sum to 1
  bool tie_embeddings = false;  // the LM head is wte
  int dense_dim = 0;            // hidden width of the dense SwiGLU MLP layers
  std::vector<int> dense_layers;  // ascending layer ids whose MLP is dense (no router/experts)
  BalanceLoss balance_loss = BalanceLoss::Sequence;
  int pad_token_id = -1;  // transformers' padding_idx: the input embedding of this token gets no
                          //   gradient (its LM-head row does); -1 = none
};

// Upper bounds of validate(), far above today's largest open models, chosen so that every width
// the ops hold in an int fits one and no size formed from a config overflows 64 bits. A config
// beyond one is bad input; to go past a bound, raise it here (and check the ops' int widths).
constexpr int64_t kMaxVocabSize = 1 << 22;    // V
constexpr int64_t kMaxSeqLen = 1 << 21;       // T_max
constexpr int64_t kMaxDim = 1 << 16;          // C, D, and each of H, Hkv
constexpr int64_t kMaxLayers = 1 << 10;       // L
constexpr int64_t kMaxExperts = 1 << 14;      // E (and so K)
constexpr int64_t kMaxHiddenDim = 1 << 18;    // F, dense_dim
constexpr int64_t kMaxQkvWidth = 1 << 18;     // (H + 2 Hkv) * D, the widest attention row
constexpr int64_t kMaxParams = int64_t{1} << 40;  // every parameter, all experts (4 TiB in fp32)

// Resolved widths: Hkv, D, the q block H*D and the k (= v) block Hkv*D of a qkv row. Formed in
// 64 bits; a validated config keeps each below kMaxQkvWidth.
int kv_heads(const ModelConfig& cfg);
int head_dim(const ModelConfig& cfg);
inline int64_t q_width(const ModelConfig& cfg) { return (int64_t)cfg.num_heads * head_dim(cfg); }
inline int64_t kv_width(const ModelConfig& cfg) { return (int64_t)kv_heads(cfg) * head_dim(cfg); }
inline int64_t qkv_width(const ModelConfig& cfg) { return q_width(cfg) + 2 * kv_width(cfg); }
bool is_dense_layer(const ModelConfig& cfg, int layer);
int num_moe_layers(const ModelConfig& cfg);

// Parameters of the whole model (every expert), as make_layout lays them out; 64-bit, exact for
// a config within the bounds above.
int64_t num_params(const ModelConfig& cfg);

// Throws BadInput naming the field, its value and the bound if the config cannot describe a
// model or lies beyond a bound above.
void validate(const ModelConfig& cfg);

// JSON object text, e.g. {"vocab_size":32,...}; io/checkpoint parses it back. Fields at their
// default are left out, so a moerl-architecture config reads as it always has.
std::string config_to_json(const ModelConfig& cfg);

}  // namespace moerl::model
