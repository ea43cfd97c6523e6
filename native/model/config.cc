// Validation and JSON text for ModelConfig.
#include "model/config.h"

#include <sstream>  // std::ostringstream

#include "common/check.h"

namespace moerl::model {

void validate(const ModelConfig& c) {
  MOERL_CHECK_INPUT(c.vocab_size > 0, "config: vocab_size must be > 0, got ", c.vocab_size);
  MOERL_CHECK_INPUT(c.max_seq_len > 0, "config: max_seq_len must be > 0, got ", c.max_seq_len);
  MOERL_CHECK_INPUT(c.dim > 0, "config: dim must be > 0, got ", c.dim);
  MOERL_CHECK_INPUT(c.num_layers > 0, "config: num_layers must be > 0, got ", c.num_layers);
  MOERL_CHECK_INPUT(c.num_heads > 0 && c.dim % c.num_heads == 0,
                    "config: num_heads must divide dim (", c.dim, "), got ", c.num_heads);
  MOERL_CHECK_INPUT(c.num_experts > 0, "config: num_experts must be > 0, got ", c.num_experts);
  MOERL_CHECK_INPUT(c.top_k > 0 && c.top_k <= c.num_experts,
                    "config: top_k must be in [1, num_experts], got ", c.top_k);
  MOERL_CHECK_INPUT(c.expert_dim > 0, "config: expert_dim must be > 0, got ", c.expert_dim);
  MOERL_CHECK_INPUT(c.norm_eps > 0.0f, "config: norm_eps must be > 0, got ", c.norm_eps);
}

std::string config_to_json(const ModelConfig& c) {
  std::ostringstream os;
  os.precision(9);
  os << "{\"vocab_size\":" << c.vocab_size << ",\"max_seq_len\":" << c.max_seq_len
     << ",\"dim\":" << c.dim << ",\"num_layers\":" << c.num_layers
     << ",\"num_heads\":" << c.num_heads << ",\"num_experts\":" << c.num_experts
     << ",\"top_k\":" << c.top_k << ",\"expert_dim\":" << c.expert_dim
     << ",\"norm_eps\":" << c.norm_eps << "}";
  return os.str();
}

}  // namespace moerl::model
