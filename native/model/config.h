// Shape of the MoE policy. One struct travels through checkpoints, tools and tests.
#pragma once

#include <string>

namespace moerl::model {

struct ModelConfig {
  int vocab_size = 0;   // V
  int max_seq_len = 0;  // T_max, rows of the position embedding
  int dim = 0;          // C
  int num_layers = 0;   // L
  int num_heads = 0;    // H, C % H == 0
  int num_experts = 0;  // E, divisible by the EP world size
  int top_k = 0;        // K <= E
  int expert_dim = 0;   // F, hidden width of each SwiGLU expert
  float norm_eps = 1e-5f;
};

// Throws BadInput naming the field if the config cannot describe a model.
void validate(const ModelConfig& cfg);

// JSON object text, e.g. {"vocab_size":32,...}; io/checkpoint parses it back.
std::string config_to_json(const ModelConfig& cfg);

}  // namespace moerl::model
