// Parameter list, arena layout and deterministic init.
#include "model/weights.h"

#include <cmath>       // std::sqrt, std::log, std::cos
#include <functional>  // std::function

#include "common/check.h"

namespace moerl::model {
namespace {

using Visitor = std::function<void(const std::string& name, std::vector<int64_t> shape,
                                   int expert, float** slot)>;

// THE list of parameters. Order here is the order in the arenas and in checkpoints.
void visit_params(const ModelConfig& c, int e0, int ne, Weights& w, const Visitor& f) {
  const int64_t V = c.vocab_size, C = c.dim, F = c.expert_dim, E = c.num_experts;
  const int64_t W = qkv_width(c), Q = q_width(c), D = head_dim(c), Fd = c.dense_dim;
  w.layers.resize(c.num_layers);
  f("wte", {V, C}, -1, &w.wte);
  if (c.rope_theta == 0.0f) f("wpe", {c.max_seq_len, C}, -1, &w.wpe);
  for (int l = 0; l < c.num_layers; l++) {
    LayerWeights& lw = w.layers[l];
    std::string p = "layers." + std::to_string(l) + ".";
    f(p + "ln1", {C}, -1, &lw.ln1);
    f(p + "wqkv", {W, C}, -1, &lw.wqkv);
    if (c.qk_norm) {
      f(p + "q_norm", {D}, -1, &lw.q_norm);
      f(p + "k_norm", {D}, -1, &lw.k_norm);
    }
    f(p + "wo", {C, Q}, -1, &lw.wo);
    f(p + "ln2", {C}, -1, &lw.ln2);
    if (is_dense_layer(c, l)) {
      f(p + "mlp.w1", {Fd, C}, -1, &lw.mlp.w1);
      f(p + "mlp.w3", {Fd, C}, -1, &lw.mlp.w3);
      f(p + "mlp.w2", {C, Fd}, -1, &lw.mlp.w2);
      continue;
    }
    f(p + "router", {E, C}, -1, &lw.router);
    lw.experts.resize(ne);
    for (int i = 0; i < ne; i++) {
      int e = e0 + i;
      std::string q = p + "experts." + std::to_string(e) + ".";
      f(q + "w1", {F, C}, e, &lw.experts[i].w1);
      f(q + "w3", {F, C}, e, &lw.experts[i].w3);
      f(q + "w2", {C, F}, e, &lw.experts[i].w2);
    }
  }
  f("lnf", {C}, -1, &w.lnf);
  if (!c.tie_embeddings) f("lm_head", {V, C}, -1, &w.lm_head);
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ParamLayout make_layout(const ModelConfig& cfg, int first_expert, int num_local_experts) {
  validate(cfg);
  MOERL_CHECK(first_expert >= 0 && first_expert + num_local_experts <= cfg.num_experts,
              "expert range [", first_expert, ",", first_expert + num_local_experts,
              ") outside num_experts ", cfg.num_experts);
  ParamLayout l;
  l.cfg = cfg;
  l.first_expert = first_expert;
  l.num_local_experts = num_local_experts;
  Weights scratch;
  visit_params(cfg, first_expert, num_local_experts, scratch,
               [&](const std::string& name, std::vector<int64_t> shape, int expert, float**) {
                 TensorSpec s;
                 s.name = name;
                 s.shape = shape;
                 s.expert = expert;
                 s.numel = 1;
                 for (int64_t d : shape) s.numel *= (size_t)d;
                 size_t& total = expert < 0 ? l.dense_numel : l.expert_numel;
                 s.offset = total;
                 total += s.numel;
                 (expert < 0 ? l.dense : l.experts).push_back(s);
               });
  return l;
}

Weights bind_weights(const ParamLayout& l, float* dense, float* experts) {
  Weights w;
  size_t di = 0, ei = 0;
  visit_params(l.cfg, l.first_expert, l.num_local_experts, w,
               [&](const std::string&, std::vector<int64_t>, int expert, float** slot) {
                 if (expert < 0) {
                   *slot = dense + l.dense[di++].offset;
                 } else {
                   *slot = experts + l.experts[ei++].offset;
                 }
               });
  if (l.cfg.tie_embeddings) w.lm_head = w.wte;
  return w;
}

ParamStore::ParamStore(const ParamLayout& l, bool with_grads)
    : layout(l),
      dense(l.dense_numel),
      experts(l.expert_numel),
      grad_dense(with_grads ? l.dense_numel : 0),
      grad_experts(with_grads ? l.expert_numel : 0) {
  w = bind_weights(layout, dense.data(), experts.data());
  if (with_grads) dw = bind_weights(layout, grad_dense.data(), grad_experts.data());
}

void ParamStore::zero_grad() {
  std::fill(grad_dense.begin(), grad_dense.end(), 0.0f);
  std::fill(grad_experts.begin(), grad_experts.end(), 0.0f);
}

void ParamStore::init_random(uint64_t seed) {
  const float std_out = 0.02f / std::sqrt(2.0f * layout.cfg.num_layers);
  auto fill = [&](const TensorSpec& s, float* p) {
    if (ends_with(s.name, "ln1") || ends_with(s.name, "ln2") || s.name == "lnf" ||
        ends_with(s.name, "_norm")) {
      for (size_t i = 0; i < s.numel; i++) p[i] = 1.0f;
      return;
    }
    float stddev = (ends_with(s.name, ".wo") || ends_with(s.name, ".w2")) ? std_out : 0.02f;
    uint64_t st = seed ^ hash_name(s.name);
    for (size_t i = 0; i < s.numel; i += 2) {
      // Box-Muller: two normals from two uniforms in (0,1].
      double u1 = ((splitmix64(st) >> 11) + 1.0) * 0x1.0p-53;
      double u2 = (splitmix64(st) >> 11) * 0x1.0p-53;
      double r = std::sqrt(-2.0 * std::log(u1));
      p[i] = (float)(stddev * r * std::cos(2.0 * M_PI * u2));
      if (i + 1 < s.numel) p[i + 1] = (float)(stddev * r * std::sin(2.0 * M_PI * u2));
    }
  };
  for (const TensorSpec& s : layout.dense) fill(s, dense.data() + s.offset);
  for (const TensorSpec& s : layout.experts) fill(s, experts.data() + s.offset);
}

float* ParamStore::find(const std::string& name, bool* is_expert) {
  for (const TensorSpec& s : layout.dense)
    if (s.name == name) {
      if (is_expert) *is_expert = false;
      return dense.data() + s.offset;
    }
  for (const TensorSpec& s : layout.experts)
    if (s.name == name) {
      if (is_expert) *is_expert = true;
      return experts.data() + s.offset;
    }
  return nullptr;
}

}  // namespace moerl::model
