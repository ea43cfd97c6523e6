// The parameter list of the MoE policy, generated from one visitor so that the size
// table, names and pointer views can never drift apart (llm.c keeps three hand-synced
// lists; we keep one). Dense tensors are replicated on every rank; expert tensors are
// sharded: rank r holds experts [r*E/R, (r+1)*E/R).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace moerl::model {

struct TensorSpec {
  std::string name;            // e.g. "layers.0.wqkv", "layers.1.experts.5.w1", "layers.0.mlp.w2"
  std::vector<int64_t> shape;  // row-major
  int expert = -1;             // global expert id, -1 for dense tensors
  size_t offset = 0;           // in floats, into the dense or the expert arena
  size_t numel = 0;
};

struct ExpertWeights {
  float* w1 = nullptr;  // [F,C] gate projection
  float* w3 = nullptr;  // [F,C] up projection
  float* w2 = nullptr;  // [C,F] down projection
};

// Widths: W = qkv_width (H*D + 2*Hkv*D), Q = q_width (H*D), D = head_dim (config.h).
struct LayerWeights {
  float* ln1 = nullptr;     // [C]
  float* wqkv = nullptr;    // [W,C]: q rows [0,Q), k rows [Q,Q+Hkv*D), v rows after
  float* q_norm = nullptr;  // [D] (qk_norm only)
  float* k_norm = nullptr;  // [D] (qk_norm only)
  float* wo = nullptr;      // [C,Q]
  float* ln2 = nullptr;     // [C]
  float* router = nullptr;  // [E,C] (MoE layers)
  std::vector<ExpertWeights> experts;  // local experts only (MoE layers)
  ExpertWeights mlp;        // dense layers: w1, w3 [dense_dim,C], w2 [C,dense_dim]
};

struct Weights {
  float* wte = nullptr;  // [V,C]
  float* wpe = nullptr;  // [T_max,C] (learned positions only; null with RoPE)
  std::vector<LayerWeights> layers;
  float* lnf = nullptr;      // [C]
  float* lm_head = nullptr;  // [V,C]; == wte when the embeddings are tied
};

struct ParamLayout {
  ModelConfig cfg;
  int first_expert = 0;       // global id of local expert 0
  int num_local_experts = 0;  // E / R
  std::vector<TensorSpec> dense;
  std::vector<TensorSpec> experts;
  size_t dense_numel = 0;
  size_t expert_numel = 0;
};

ParamLayout make_layout(const ModelConfig& cfg, int first_expert, int num_local_experts);

// Pointer views into arenas laid out by `layout` (used for parameters, gradients, moments).
Weights bind_weights(const ParamLayout& layout, float* dense, float* experts);

// Parameters + gradients of one rank, each in two arenas (dense, local experts).
struct ParamStore {
  ParamLayout layout;
  std::vector<float> dense, experts, grad_dense, grad_experts;
  Weights w, dw;

  // with_grads = false: parameters only (import, export, scoring), dw left unbound.
  explicit ParamStore(const ParamLayout& l, bool with_grads = true);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;
  void zero_grad();
  // Deterministic init from a seed: N(0, 0.02) style (Box-Muller on splitmix64), norms at 1,
  // output projections scaled by 1/sqrt(2L). Expert e's values depend only on (seed, name),
  // so any sharding yields the same global model.
  void init_random(uint64_t seed);
  float* find(const std::string& name, bool* is_expert = nullptr);
};

}  // namespace moerl::model
