// Validation and JSON text for ModelConfig.
#include "model/config.h"

#include <algorithm>  // std::binary_search, std::is_sorted, std::adjacent_find
#include <cmath>      // std::isfinite
#include <sstream>    // std::ostringstream

#include "common/check.h"

namespace moerl::model {

int kv_heads(const ModelConfig& c) { return c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads; }

int head_dim(const ModelConfig& c) {
  return c.head_dim > 0 ? c.head_dim : (c.num_heads > 0 ? c.dim / c.num_heads : 0);
}

bool is_dense_layer(const ModelConfig& c, int layer) {
  return std::binary_search(c.dense_layers.begin(), c.dense_layers.end(), layer);
}

int num_moe_layers(const ModelConfig& c) { return c.num_layers - (int)c.dense_layers.size(); }

int64_t num_params(const ModelConfig& c) {
  const int64_t V = c.vocab_size, C = c.dim, L = c.num_layers, Ld = (int64_t)c.dense_layers.size();
  const int64_t embeddings = V * C * (c.tie_embeddings ? 1 : 2) +
                             (c.rope_theta == 0.0f ? (int64_t)c.max_seq_len * C : 0);
  const int64_t attention = 2 * C + qkv_width(c) * C + C * q_width(c) +
                            (c.qk_norm ? 2 * (int64_t)head_dim(c) : 0);
  const int64_t dense_mlp = 3 * (int64_t)c.dense_dim * C;
  const int64_t moe = (int64_t)c.num_experts * C + 3 * (int64_t)c.num_experts * c.expert_dim * C;
  return embeddings + C + L * attention + Ld * dense_mlp + (L - Ld) * moe;
}

namespace {

// BadInput naming the field, its value, the bound and where to raise it.
void check_bound(const char* field, int64_t value, int64_t max, const char* constant) {
  MOERL_CHECK_INPUT(value <= max, "config: ", field, " = ", value, " exceeds the bound ", max, " (",
                    constant, " in native/model/config.h; a build with it raised allows more)");
}

}  // namespace

void validate(const ModelConfig& c) {
  MOERL_CHECK_INPUT(c.vocab_size > 0, "config: vocab_size must be > 0, got ", c.vocab_size);
  MOERL_CHECK_INPUT(c.max_seq_len > 0, "config: max_seq_len must be > 0, got ", c.max_seq_len);
  MOERL_CHECK_INPUT(c.dim > 0, "config: dim must be > 0, got ", c.dim);
  MOERL_CHECK_INPUT(c.num_layers > 0, "config: num_layers must be > 0, got ", c.num_layers);
  MOERL_CHECK_INPUT(c.num_heads > 0, "config: num_heads must be > 0, got ", c.num_heads);
  // Each field within its bound first, so that no product below can overflow.
  check_bound("vocab_size", c.vocab_size, kMaxVocabSize, "kMaxVocabSize");
  check_bound("max_seq_len", c.max_seq_len, kMaxSeqLen, "kMaxSeqLen");
  check_bound("dim", c.dim, kMaxDim, "kMaxDim");
  check_bound("num_layers", c.num_layers, kMaxLayers, "kMaxLayers");
  check_bound("num_heads", c.num_heads, kMaxDim, "kMaxDim");
  check_bound("num_kv_heads", c.num_kv_heads, kMaxDim, "kMaxDim");
  check_bound("head_dim", c.head_dim, kMaxDim, "kMaxDim");
  check_bound("num_experts", c.num_experts, kMaxExperts, "kMaxExperts");
  check_bound("expert_dim", c.expert_dim, kMaxHiddenDim, "kMaxHiddenDim");
  check_bound("dense_dim", c.dense_dim, kMaxHiddenDim, "kMaxHiddenDim");
  MOERL_CHECK_INPUT(c.head_dim > 0 || c.dim % c.num_heads == 0, "config: num_heads must divide dim (",
                    c.dim, ") unless head_dim is given, got ", c.num_heads);
  MOERL_CHECK_INPUT(c.head_dim >= 0, "config: head_dim must be >= 0 (0 = dim / num_heads), got ",
                    c.head_dim);
  MOERL_CHECK_INPUT(c.num_kv_heads >= 0 && c.num_heads % kv_heads(c) == 0,
                    "config: num_kv_heads must divide num_heads (", c.num_heads, "), got ",
                    c.num_kv_heads);
  check_bound("(num_heads + 2 num_kv_heads) * head_dim", qkv_width(c), kMaxQkvWidth, "kMaxQkvWidth");
  MOERL_CHECK_INPUT(std::isfinite(c.rope_theta) && c.rope_theta >= 0.0f,
                    "config: rope_theta must be finite and >= 0, got ", c.rope_theta);
  MOERL_CHECK_INPUT(c.rope_theta == 0.0f || head_dim(c) % 2 == 0,
                    "config: RoPE needs an even head_dim, got ", head_dim(c));
  MOERL_CHECK_INPUT(c.num_experts > 0, "config: num_experts must be > 0, got ", c.num_experts);
  MOERL_CHECK_INPUT(c.top_k > 0 && c.top_k <= c.num_experts,
                    "config: top_k must be in [1, num_experts], got ", c.top_k);
  MOERL_CHECK_INPUT(c.expert_dim > 0, "config: expert_dim must be > 0, got ", c.expert_dim);
  MOERL_CHECK_INPUT(std::isfinite(c.norm_eps) && c.norm_eps > 0.0f,
                    "config: norm_eps must be finite and > 0, got ", c.norm_eps);
  MOERL_CHECK_INPUT(std::is_sorted(c.dense_layers.begin(), c.dense_layers.end()) &&
                        std::adjacent_find(c.dense_layers.begin(), c.dense_layers.end()) ==
                            c.dense_layers.end(),
                    "config: dense_layers must be ascending and distinct");
  for (int l : c.dense_layers)
    MOERL_CHECK_INPUT(l >= 0 && l < c.num_layers, "config: dense layer ", l, " outside [0, ",
                      c.num_layers, ")");
  MOERL_CHECK_INPUT(c.pad_token_id >= -1 && c.pad_token_id < c.vocab_size,
                    "config: pad_token_id must be in [-1, vocab_size), got ", c.pad_token_id);
  MOERL_CHECK_INPUT(c.dense_layers.empty() || c.dense_dim > 0,
                    "config: dense_dim must be > 0 when dense_layers are given, got ", c.dense_dim);
  check_bound("the parameter count", num_params(c), kMaxParams, "kMaxParams");
}

std::string config_to_json(const ModelConfig& c) {
  std::ostringstream os;
  os.precision(9);
  os << "{\"vocab_size\":" << c.vocab_size << ",\"max_seq_len\":" << c.max_seq_len
     << ",\"dim\":" << c.dim << ",\"num_layers\":" << c.num_layers
     << ",\"num_heads\":" << c.num_heads << ",\"num_experts\":" << c.num_experts
     << ",\"top_k\":" << c.top_k << ",\"expert_dim\":" << c.expert_dim
     << ",\"norm_eps\":" << c.norm_eps;
  if (c.num_kv_heads > 0) os << ",\"num_kv_heads\":" << c.num_kv_heads;
  if (c.head_dim > 0) os << ",\"head_dim\":" << c.head_dim;
  if (c.rope_theta > 0.0f) os << ",\"rope_theta\":" << c.rope_theta;
  if (c.qk_norm) os << ",\"qk_norm\":true";
  if (!c.norm_topk_prob) os << ",\"norm_topk_prob\":false";
  if (c.tie_embeddings) os << ",\"tie_embeddings\":true";
  if (!c.dense_layers.empty()) {
    os << ",\"dense_dim\":" << c.dense_dim << ",\"dense_layers\":[";
    for (size_t i = 0; i < c.dense_layers.size(); i++) os << (i ? "," : "") << c.dense_layers[i];
    os << "]";
  }
  if (c.balance_loss == BalanceLoss::Batch) os << ",\"balance_loss\":\"batch\"";
  if (c.pad_token_id >= 0) os << ",\"pad_token_id\":" << c.pad_token_id;
  os << "}";
  return os.str();
}

}  // namespace moerl::model
