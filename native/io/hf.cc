// Hugging Face model directories: config.json mapping, per-family tensor names, sharded
// safetensors read per tensor and written by shards.
#include "io/hf.h"

#include <cstdio>   // std::snprintf: shard file names
#include <fstream>  // std::ifstream: which side files exist
#include <map>
#include <set>
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace moerl::io {
namespace {

// Fields that do not change what the model computes (names, ids of special tokens, training
// and serving options moerl sets itself).
const std::set<std::string> kInert = {
    "architectures",  "model_type",    "dtype",          "torch_dtype", "transformers_version",
    "bos_token_id",   "eos_token_id",  "initializer_range", "use_cache",
    "output_router_logits", "router_aux_loss_coef", "_name_or_path", "max_window_layers",
    "max_position_embeddings"};

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); i++) s += (i ? sep : "") + items[i];
  return s;
}

std::string dtype_of(const std::string& torch_name, const std::string& what) {
  if (torch_name == "float32") return "F32";
  if (torch_name == "bfloat16") return "BF16";
  if (torch_name == "float16") return "F16";
  MOERL_FAIL(BadInput, what, ": dtype ", torch_name, " is not supported (float32, bfloat16, float16)");
}

// A file of the model directory by name, as the index must name its shards: no path out of it
// (../x, /x, a/b, a\b), no hidden file, no NUL that would cut the name short.
bool is_plain_file_name(const std::string& f) {
  return !f.empty() && f[0] != '.' && f.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

// name -> file of every tensor: the index's weight_map, or model.safetensors' header.
std::map<std::string, std::string> weight_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  const std::string index = dir + "/model.safetensors.index.json";
  std::string text;
  bool has_index = true;
  try {
    text = read_file(index);
  } catch (const Error&) {
    has_index = false;
  }
  if (has_index) {
    Json j = parse_json(text, index);
    const Json& map = field(j, "weight_map", index);
    MOERL_CHECK_INPUT(map.is_object(), index, ": weight_map is not an object");
    for (const auto& [name, file] : map.items()) {
      const std::string& f = as_string(file, index + " tensor " + name);
      MOERL_CHECK_INPUT(is_plain_file_name(f), index, ": tensor ", name, " maps to ",
                        Json(f).dump(), ", not a file name of this directory");
      files[name] = f;
    }
    return files;
  }
  const std::string single = dir + "/model.safetensors";
  SafetensorsHeader h;
  try {
    h = read_safetensors_header(single);
  } catch (const Error& e) {
    MOERL_FAIL(BadInput, dir, " has no model.safetensors.index.json and no readable ",
               "model.safetensors (", e.what(), ")");
  }
  for (const auto& [name, t] : h.tensors) files[name] = "model.safetensors";
  return files;
}

}  // namespace

HfModel read_hf_config(const std::string& dir, int max_seq_len) {
  const std::string path = dir + "/config.json";
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error&) {
    MOERL_FAIL(BadInput, dir, " is not a Hugging Face model directory: no readable config.json");
  }
  const Json j = parse_json(text, path);
  MOERL_CHECK_INPUT(j.is_object(), path, ": not a JSON object");
  HfModel m;
  m.dir = dir;
  m.family = string_field(j, "model_type", path);
  MOERL_CHECK_INPUT(m.family == "qwen3_moe" || m.family == "mixtral", path, ": model_type ",
                    m.family, " is not supported (qwen3_moe, mixtral)");
  const bool qwen = m.family == "qwen3_moe";

  std::vector<std::string> problems;
  std::set<std::string> seen;
  // The value of a field, null when absent or JSON null.
  auto get = [&](const std::string& key) -> const Json* {
    seen.insert(key);
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  auto integer = [&](const std::string& key, int fallback, bool required) {
    const Json* v = get(key);
    if (v == nullptr) {
      if (required) problems.push_back("missing field " + key);
      return fallback;
    }
    return as_int(*v, path + " field " + key);
  };
  auto must = [&](const std::string& key, const Json& allowed, const std::string& says) {
    const Json* v = get(key);
    if (v != nullptr && *v != allowed) problems.push_back(key + " = " + v->dump() + " (" + says + ")");
  };

  model::ModelConfig& c = m.cfg;
  c.vocab_size = integer("vocab_size", 0, true);
  c.dim = integer("hidden_size", 0, true);
  c.num_layers = integer("num_hidden_layers", 0, true);
  c.num_heads = integer("num_attention_heads", 0, true);
  c.num_kv_heads = integer("num_key_value_heads", c.num_heads, false);
  c.head_dim = integer("head_dim", 0, false);
  c.top_k = integer("num_experts_per_tok", 0, true);
  if (const Json* v = get("rms_norm_eps")) c.norm_eps = (float)as_number(*v, path + " rms_norm_eps");
  else problems.push_back("missing field rms_norm_eps");
  // experts: transformers 4 writes num_experts for Qwen3-MoE, 5 writes num_local_experts
  const int local = integer("num_local_experts", 0, false);
  c.num_experts = qwen ? integer("num_experts", local, local == 0) : integer("num_local_experts", 0, true);
  c.expert_dim = integer(qwen ? "moe_intermediate_size" : "intermediate_size", 0, true);
  // RoPE: rope_parameters (transformers 5) or rope_theta (4); default scaling only
  float theta = qwen ? 10000.0f : 1e6f;
  if (const Json* rp = get("rope_parameters")) {
    if (rp->contains("rope_theta")) theta = (float)number_field(*rp, "rope_theta", path + " rope_parameters");
    if (rp->contains("rope_type") && (*rp)["rope_type"] != "default")
      problems.push_back("rope_parameters.rope_type = " + (*rp)["rope_type"].dump() +
                         " (only default RoPE is implemented)");
    for (const auto& [k, v] : rp->items())
      if (k != "rope_theta" && k != "rope_type")
        problems.push_back("rope_parameters." + k + " (RoPE scaling is not implemented)");
  }
  if (const Json* v = get("rope_theta")) theta = (float)as_number(*v, path + " rope_theta");
  if (const Json* v = get("rope_scaling"))
    problems.push_back("rope_scaling = " + v->dump() + " (RoPE scaling is not implemented)");
  c.rope_theta = theta;
  c.tie_embeddings = false;
  if (const Json* v = get("tie_word_embeddings")) c.tie_embeddings = as_bool(*v, path + " tie_word_embeddings");
  must("hidden_act", "silu", "only SwiGLU with silu is implemented");
  must("attention_bias", false, "q/k/v/o biases are not implemented");
  must("attention_dropout", 0.0, "dropout is not implemented");
  c.qk_norm = qwen;
  c.balance_loss = model::BalanceLoss::Batch;
  if (qwen) {
    c.norm_topk_prob = false;
    if (const Json* v = get("norm_topk_prob")) c.norm_topk_prob = as_bool(*v, path + " norm_topk_prob");
    must("use_sliding_window", false, "sliding-window attention is not implemented");
    get("sliding_window");  // used only with use_sliding_window
    c.dense_dim = integer("intermediate_size", 0, false);
    const int step = integer("decoder_sparse_step", 1, false);
    std::set<int> mlp_only;
    if (const Json* v = get("mlp_only_layers"))
      for (const Json& l : as_array(*v, path + " mlp_only_layers"))
        mlp_only.insert(as_int(l, path + " mlp_only_layers"));
    if (step <= 0) problems.push_back("decoder_sparse_step = " + std::to_string(step) + " (must be >= 1)");
    for (int l = 0; l < c.num_layers && step > 0; l++)
      if (mlp_only.count(l) || (l + 1) % step != 0) c.dense_layers.push_back(l);
  } else {
    c.norm_topk_prob = true;
    must("sliding_window", nullptr, "sliding-window attention is not implemented");
    must("router_jitter_noise", 0.0, "router noise is not implemented");
  }
  if (const Json* v = get("pad_token_id")) c.pad_token_id = as_int(*v, path + " pad_token_id");
  if (const Json* v = get("router_aux_loss_coef"))
    m.router_aux_loss_coef = (float)as_number(*v, path + " router_aux_loss_coef");
  m.dtype = "F32";
  for (const char* key : {"dtype", "torch_dtype"})
    if (const Json* v = get(key)) m.dtype = dtype_of(as_string(*v, path + " " + key), path + " " + key);
  const int max_pos = integer("max_position_embeddings", 0, true);
  c.max_seq_len = max_seq_len > 0 ? max_seq_len : max_pos;
  if (max_pos > 0 && c.max_seq_len > max_pos)
    problems.push_back("max_position_embeddings = " + std::to_string(max_pos) +
                       " is below the requested max_seq_len " + std::to_string(c.max_seq_len));

  for (const auto& [key, v] : j.items())
    if (!seen.count(key) && !kInert.count(key)) problems.push_back("unsupported field " + key);
  MOERL_CHECK_INPUT(problems.empty(), path, " (", m.family, "): ", join(problems, "; "));
  model::validate(c);
  return m;
}

std::vector<HfPiece> hf_pieces(const HfModel& m, const std::string& name, int64_t rows) {
  const bool qwen = m.family == "qwen3_moe";
  if (name == "wte") return {{"model.embed_tokens.weight", 0, rows}};
  if (name == "lnf") return {{"model.norm.weight", 0, rows}};
  if (name == "lm_head") return {{"lm_head.weight", 0, rows}};
  MOERL_CHECK(name.rfind("layers.", 0) == 0, "no Hugging Face name for tensor ", name);
  const size_t dot = name.find('.', 7);
  const std::string layer = name.substr(7, dot - 7), rest = name.substr(dot + 1);
  const std::string p = "model.layers." + layer + ".";
  const std::string moe = p + (qwen ? "mlp." : "block_sparse_moe.");
  if (rest == "wqkv") {
    const int64_t Q = model::q_width(m.cfg), KV = model::kv_width(m.cfg);
    return {{p + "self_attn.q_proj.weight", 0, Q},
            {p + "self_attn.k_proj.weight", Q, KV},
            {p + "self_attn.v_proj.weight", Q + KV, KV}};
  }
  static const std::map<std::string, std::string> attn = {
      {"ln1", "input_layernorm.weight"},    {"ln2", "post_attention_layernorm.weight"},
      {"wo", "self_attn.o_proj.weight"},     {"q_norm", "self_attn.q_norm.weight"},
      {"k_norm", "self_attn.k_norm.weight"}, {"mlp.w1", "mlp.gate_proj.weight"},
      {"mlp.w3", "mlp.up_proj.weight"},      {"mlp.w2", "mlp.down_proj.weight"}};
  if (auto it = attn.find(rest); it != attn.end()) return {{p + it->second, 0, rows}};
  if (rest == "router") return {{moe + "gate.weight", 0, rows}};
  if (rest.rfind("experts.", 0) == 0) {
    const size_t d2 = rest.find('.', 8);
    const std::string e = rest.substr(8, d2 - 8), w = rest.substr(d2 + 1);
    static const std::map<std::string, std::string> qwen_w = {
        {"w1", "gate_proj"}, {"w3", "up_proj"}, {"w2", "down_proj"}};
    return {{moe + "experts." + e + "." + (qwen ? qwen_w.at(w) : w) + ".weight", 0, rows}};
  }
  MOERL_FAIL(Internal, "no Hugging Face name for tensor ", name);
}

namespace {

// Every (piece, shape) of the full model, in layout order.
struct Expected {
  const model::TensorSpec* spec;
  HfPiece piece;
  std::vector<int64_t> shape;
};

std::vector<Expected> expected_tensors(const HfModel& m, const model::ParamLayout& full) {
  std::vector<Expected> out;
  for (const auto* list : {&full.dense, &full.experts})
    for (const model::TensorSpec& s : *list)
      for (const HfPiece& p : hf_pieces(m, s.name, s.shape[0])) {
        std::vector<int64_t> shape = s.shape;
        shape[0] = p.rows;
        out.push_back({&s, p, shape});
      }
  return out;
}

}  // namespace

void load_hf_weights(const HfModel& m, model::ParamStore& ps) {
  const model::ParamLayout full = model::make_layout(m.cfg, 0, m.cfg.num_experts);
  const std::map<std::string, std::string> files = weight_files(m.dir);
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto& [name, file] : files)
    if (!headers.count(file)) headers[file] = read_safetensors_header(m.dir + "/" + file);

  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const Expected& x : expected_tensors(m, full)) {
    wanted.insert(x.piece.hf_name);
    auto f = files.find(x.piece.hf_name);
    if (f == files.end()) {
      problems.push_back("missing tensor " + x.piece.hf_name);
      continue;
    }
    const SafetensorsHeader& h = headers.at(f->second);
    auto t = h.tensors.find(x.piece.hf_name);
    if (t == h.tensors.end()) {
      problems.push_back(f->second + " lacks tensor " + x.piece.hf_name + " (the index names it)");
    } else if (t->second.shape != x.shape) {
      std::ostringstream os;
      os << f->second << ": " << x.piece.hf_name << " has shape " << Json(t->second.shape).dump()
         << ", the config says " << Json(x.shape).dump();
      problems.push_back(os.str());
    }
  }
  for (const auto& [name, file] : files)
    if (!wanted.count(name) && !(m.cfg.tie_embeddings && name == "lm_head.weight"))
      problems.push_back(file + ": tensor " + name + " is not part of this " + m.family +
                         " config (config/weights mismatch)");
  if (problems.size() > 20) {
    const size_t more = problems.size() - 20;
    problems.resize(20);
    problems.push_back("and " + std::to_string(more) + " more");
  }
  MOERL_CHECK_INPUT(problems.empty(), m.dir, ": ", join(problems, "; "));

  // This rank's tensors only: the dense ones and its experts.
  const model::ParamLayout& l = ps.layout;
  for (int expert_arena = 0; expert_arena < 2; expert_arena++) {
    const auto& specs = expert_arena ? l.experts : l.dense;
    float* base = expert_arena ? ps.experts.data() : ps.dense.data();
    for (const model::TensorSpec& s : specs) {
      const size_t cols = s.numel / (size_t)s.shape[0];
      for (const HfPiece& p : hf_pieces(m, s.name, s.shape[0])) {
        std::vector<int64_t> shape = s.shape;
        shape[0] = p.rows;
        const std::string& file = files.at(p.hf_name);
        read_tensor_f32(headers.at(file), p.hf_name, shape, base + s.offset + p.row0 * cols);
      }
    }
  }
}

std::vector<std::pair<std::string, std::string>> hf_side_files(const std::string& dir) {
  static const char* kNames[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                 "special_tokens_map.json", "chat_template.jinja", "vocab.json",
                                 "merges.txt", "tokenizer.model", "added_tokens.json"};
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : kNames) {
    const std::string path = dir + "/" + name;
    if (!std::ifstream(path).good()) continue;
    out.emplace_back(name, read_file(path));
  }
  return out;
}

void save_hf(const std::string& out_dir, const HfModel& m, const model::ParamStore& ps,
             const std::string& config_json, uint64_t max_shard_bytes,
             const std::vector<std::pair<std::string, std::string>>& beside) {
  const model::ParamLayout& l = ps.layout;
  MOERL_CHECK(l.num_local_experts == m.cfg.num_experts, "save_hf needs every expert, this store holds ",
              l.num_local_experts, " of ", m.cfg.num_experts);
  const size_t eb = dtype_bytes(m.dtype, out_dir);
  std::vector<std::vector<TensorOut>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const Expected& x : expected_tensors(m, l)) {
    const bool expert = x.spec->expert >= 0;
    const float* base = (expert ? ps.experts.data() : ps.dense.data()) + x.spec->offset;
    const size_t cols = x.spec->numel / (size_t)x.spec->shape[0];
    const uint64_t bytes = (uint64_t)x.piece.rows * cols * eb;
    if (shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back({x.piece.hf_name, x.shape, base + x.piece.row0 * cols});
    shard_bytes += bytes;
    total += bytes;
  }
  make_dirs(out_dir);
  const size_t n = shards.size();
  Json weight_map = Json::object();
  for (size_t i = 0; i < n; i++) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    const std::string file = n == 1 ? "model.safetensors" : name;
    write_safetensors(out_dir + "/" + file, shards[i], m.dtype);
    for (const TensorOut& t : shards[i]) weight_map[t.name] = file;
  }
  if (n > 1) {
    Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  for (const auto& [name, content] : beside) write_file_atomic(out_dir + "/" + name, content);
  write_file_atomic(out_dir + "/config.json", config_json);
}

}  // namespace moerl::io
