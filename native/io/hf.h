// Hugging Face model directories: config.json, safetensors weights (one file or shards with
// model.safetensors.index.json) of the Qwen3-MoE and Mixtral families, read into moerl's
// parameter layout and written back from it. One table per family maps each moerl tensor to
// the HF tensors it holds (wqkv is q_proj | k_proj | v_proj stacked by rows), so import and
// export read the same map and import-then-export is bitwise for every tensor.
#pragma once

#include <cstdint>
#include <string>
#include <utility>  // std::pair
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace moerl::io {

struct HfModel {
  std::string dir;
  std::string family;  // the config's model_type: "qwen3_moe" or "mixtral"
  std::string dtype;   // of the weights on disk: "F32", "BF16" or "F16"
  model::ModelConfig cfg;
  float router_aux_loss_coef = 0.0f;  // the config's, for the spec's default
};

// Reads dir/config.json. max_seq_len bounds the KV cache (<= max_position_embeddings; 0 = the
// config's max_position_embeddings). Every field is either used, required to have the value
// moerl implements, or known not to change the computation; any other field or value is
// BadInput, all of them listed at once.
HfModel read_hf_config(const std::string& dir, int max_seq_len);

// One HF tensor held in rows [row0, row0 + rows) of a moerl tensor.
struct HfPiece {
  std::string hf_name;
  int64_t row0 = 0, rows = 0;
};
// The HF tensors a moerl tensor (by its layout name) holds, in row order.
std::vector<HfPiece> hf_pieces(const HfModel& m, const std::string& moerl_name, int64_t rows);

// Fills this rank's parameters (dense tensors and its experts only) from the weights: reads the
// headers of the files the index names and the bytes of the tensors this rank holds, nothing
// else. Checks every tensor the model needs is present with its shape and that the files hold
// no tensor the config does not explain; errors name the file and tensor.
void load_hf_weights(const HfModel& m, model::ParamStore& ps);

// Writes an HF model directory from a full model (every expert) in m.dtype: safetensors shards
// of at most max_shard_bytes (model.safetensors alone when one suffices, else
// model-0000i-of-0000n.safetensors and model.safetensors.index.json), the files of `beside`
// (name, content: tokenizer and generation config), then config_json (the source's config.json
// text) as config.json, last.
void save_hf(const std::string& out_dir, const HfModel& m, const model::ParamStore& ps,
             const std::string& config_json, uint64_t max_shard_bytes,
             const std::vector<std::pair<std::string, std::string>>& beside = {});

// The files beside a model's weights that serving needs (tokenizer, chat template, generation
// config) which exist in dir, as (name, content).
std::vector<std::pair<std::string, std::string>> hf_side_files(const std::string& dir);

}  // namespace moerl::io
