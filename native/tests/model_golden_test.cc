// Compares the C++ model against golden values from an independent float64 reference
// (golden/model_reference.py, scalar autograd): logits, loss terms and every parameter
// gradient of a fixed tiny config. Prints the largest difference per tensor; fails on
// any tensor off by more than the tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/ops.h"

namespace moerl::model {
namespace {

struct Golden {
  std::map<std::string, std::vector<double>> rows;  // "tokens", "param wte", "grad wte", ...
  std::map<std::string, std::string> config;
};

Golden read_golden(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  Golden g;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    std::string key;
    is >> key;
    if (key == "config") {
      std::string k, v;
      while (is >> k >> v) g.config[k] = v;
      continue;
    }
    if (key == "param" || key == "grad") {
      std::string name;
      is >> name;
      key += " " + name;
    }
    double x;
    std::vector<double>& row = g.rows[key];
    while (is >> x) row.push_back(x);
  }
  return g;
}

// Largest |a - ref| relative to max(1, max |ref|).
double max_rel_diff(const float* a, const std::vector<double>& ref) {
  double max_diff = 0.0, scale = 1.0;
  for (size_t i = 0; i < ref.size(); i++) {
    max_diff = std::max(max_diff, std::fabs(a[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return max_diff / scale;
}

TEST(ModelGolden, MatchesIndependentReference) {
  Golden g = read_golden(std::string(MOERL_GOLDEN_DIR) + "/model_tiny.golden");
  ASSERT_FALSE(g.config.empty());
  ModelConfig cfg;
  cfg.vocab_size = std::stoi(g.config["vocab_size"]);
  cfg.max_seq_len = std::stoi(g.config["max_seq_len"]);
  cfg.dim = std::stoi(g.config["dim"]);
  cfg.num_layers = std::stoi(g.config["num_layers"]);
  cfg.num_heads = std::stoi(g.config["num_heads"]);
  cfg.num_experts = std::stoi(g.config["num_experts"]);
  cfg.top_k = std::stoi(g.config["top_k"]);
  cfg.expert_dim = std::stoi(g.config["expert_dim"]);
  cfg.norm_eps = std::stof(g.config["norm_eps"]);
  transport::Communicator tc{transport::Config{}};
  ExpertComm comm(tc, cfg.num_experts);
  ParamStore ps(make_layout(cfg, 0, cfg.num_experts));
  for (auto* specs : {&ps.layout.dense, &ps.layout.experts}) {
    for (const TensorSpec& s : *specs) {
      const std::vector<double>& v = g.rows["param " + s.name];
      ASSERT_EQ(v.size(), s.numel) << s.name;
      float* p = ps.find(s.name);
      for (size_t i = 0; i < s.numel; i++) p[i] = (float)v[i];
    }
  }
  const int B = (int)g.rows["batch"][0], T = (int)g.rows["batch"][1];
  std::vector<int32_t> tokens, lengths, targets;
  std::vector<float> weights;
  for (double x : g.rows["tokens"]) tokens.push_back((int32_t)x);
  for (double x : g.rows["lengths"]) lengths.push_back((int32_t)x);
  for (double x : g.rows["targets"]) targets.push_back((int32_t)x);
  for (double x : g.rows["weights"]) weights.push_back((float)x);
  const float aux_w = (float)g.rows["aux_weight"][0], z_w = (float)g.rows["z_weight"][0];

  Activations a;
  model_forward(ps, comm, tokens.data(), lengths.data(), B, T, a);
  std::vector<float> dlogits(a.logits.size(), 0.0f);
  double ce = crossentropy_forward_backward(dlogits.data(), a.logits.data(), targets.data(),
                                            weights.data(), B * T, cfg.vocab_size);
  double loss = ce + aux_w * a.aux_sum + z_w * a.z_sum;
  ps.zero_grad();
  model_backward(ps, comm, dlogits.data(), aux_w, z_w, a);

  const double tol = 2e-4;
  double d_logits = max_rel_diff(a.logits.data(), g.rows["logits"]);
  std::printf("%-28s max rel diff %.3e\n", "logits", d_logits);
  EXPECT_LT(d_logits, tol);
  EXPECT_NEAR(loss, g.rows["loss"][0], tol * std::fabs(g.rows["loss"][0]));
  EXPECT_NEAR(a.aux_sum, g.rows["aux_sum"][0], tol * std::fabs(g.rows["aux_sum"][0]));
  EXPECT_NEAR(a.z_sum, g.rows["z_sum"][0], tol * std::fabs(g.rows["z_sum"][0]));
  double worst = 0.0;
  for (auto* specs : {&ps.layout.dense, &ps.layout.experts}) {
    for (const TensorSpec& s : *specs) {
      const std::vector<double>& ref = g.rows["grad " + s.name];
      ASSERT_EQ(ref.size(), s.numel) << s.name;
      const float* grad = (s.expert < 0 ? ps.grad_dense.data() : ps.grad_experts.data()) + s.offset;
      double d = max_rel_diff(grad, ref);
      worst = std::max(worst, d);
      EXPECT_LT(d, tol) << "gradient of " << s.name;
    }
  }
  std::printf("%-28s max rel diff %.3e\n", "all gradients", worst);
}

}  // namespace
}  // namespace moerl::model
