// Finite-difference checks of each op's backward against its forward, and of the whole
// tiny model (router, top-k, balance and z losses included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "model/model.h"
#include "model/ops.h"

namespace moerl::model {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Checks d/dx of L(x) = sum(r . f(x)) against `analytic` by central differences and
// returns the largest error relative to the largest gradient.
double fd_check(std::vector<float>& x, const std::vector<float>& analytic,
                const std::function<double()>& loss, float eps = 1e-2f) {
  double max_err = 0.0, max_g = 1e-6;
  for (size_t i = 0; i < x.size(); i++) {
    float keep = x[i];
    x[i] = keep + eps;
    double lp = loss();
    x[i] = keep - eps;
    double lm = loss();
    x[i] = keep;
    double fd = (lp - lm) / (2.0 * eps);
    max_err = std::max(max_err, std::fabs(fd - analytic[i]));
    max_g = std::max(max_g, std::fabs((double)analytic[i]));
  }
  return max_err / max_g;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); i++) s += (double)a[i] * b[i];
  return s;
}

TEST(Ops, MatmulBackwardMatchesFiniteDifferences) {
  const int N = 5, IC = 7, OC = 4;
  auto inp = randn(N * IC, 1), w = randn(OC * IC, 2), r = randn(N * OC, 3);
  std::vector<float> out(N * OC), dinp(N * IC, 0.0f), dw(OC * IC, 0.0f);
  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), w.data(), N, IC, OC);
    return dot(out, r);
  };
  matmul_backward(dinp.data(), dw.data(), r.data(), inp.data(), w.data(), N, IC, OC);
  EXPECT_LT(fd_check(inp, dinp, loss), 1e-3);
  EXPECT_LT(fd_check(w, dw, loss), 1e-3);
}

TEST(Ops, RmsnormBackwardMatchesFiniteDifferences) {
  const int N = 4, C = 8;
  auto inp = randn(N * C, 4), w = randn(C, 5), r = randn(N * C, 6);
  std::vector<float> out(N * C), rstd(N), dinp(N * C, 0.0f), dw(C, 0.0f);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-5f);
    return dot(out, r);
  };
  loss();
  rmsnorm_backward(dinp.data(), dw.data(), r.data(), inp.data(), w.data(), rstd.data(), N, C);
  EXPECT_LT(fd_check(inp, dinp, loss, 1e-3f), 5e-3);
  EXPECT_LT(fd_check(w, dw, loss, 1e-3f), 5e-3);
}

TEST(Ops, AttentionBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 5, C = 8, H = 2;
  auto qkv = randn(B * T * 3 * C, 7), r = randn(B * T * C, 8);
  std::vector<float> out(B * T * C), probs(B * H * T * T), dqkv(qkv.size(), 0.0f);
  auto loss = [&] {
    attention_forward(out.data(), probs.data(), qkv.data(), B, T, H, H, C / H);
    return dot(out, r);
  };
  loss();
  attention_backward(dqkv.data(), r.data(), qkv.data(), probs.data(), B, T, H, H, C / H);
  EXPECT_LT(fd_check(qkv, dqkv, loss, 1e-3f), 5e-3);
}

TEST(Ops, SwigluBackwardMatchesFiniteDifferences) {
  const int n = 20;
  auto h1 = randn(n, 9, 2.0f), h3 = randn(n, 10), r = randn(n, 11);
  std::vector<float> act(n), dh1(n, 0.0f), dh3(n, 0.0f);
  auto loss = [&] {
    swiglu_forward(act.data(), h1.data(), h3.data(), n);
    return dot(act, r);
  };
  swiglu_backward(dh1.data(), dh3.data(), r.data(), h1.data(), h3.data(), n);
  EXPECT_LT(fd_check(h1, dh1, loss, 1e-3f), 5e-3);
  EXPECT_LT(fd_check(h3, dh3, loss, 1e-3f), 5e-3);
}

TEST(Ops, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int N = 4, V = 6;
  auto logits = randn(N * V, 12);
  std::vector<int32_t> targets = {1, 5, 0, 3};
  std::vector<float> weights = {0.25f, 0.0f, 0.5f, 1.0f}, dlogits(N * V, 0.0f);
  auto loss = [&] {
    return crossentropy_forward_backward(nullptr, logits.data(), targets.data(), weights.data(), N,
                                         V);
  };
  crossentropy_forward_backward(dlogits.data(), logits.data(), targets.data(), weights.data(), N, V);
  EXPECT_LT(fd_check(logits, dlogits, loss, 1e-3f), 5e-3);
}

// softmax_stats / softmax_probs / logsoftmax_backward against the same quantities computed with
// std::exp and std::log: vocabularies below, at and past the 8 and 16 lanes, temperatures, a
// -inf logit (no NaN from 0 * -inf), a NaN logit (NaN out, never a quiet number).
TEST(Ops, SoftmaxKernelsMatchFp64) {
  double worst_lp = 0.0, worst_h = 0.0, worst_g = 0.0, worst_p = 0.0;
  for (int V : {1, 7, 16, 37, 1000}) {
    for (float tau : {1.0f, 0.7f}) {
      auto logits = randn(V, 40 + V, 3.0f);
      if (V > 7) logits[5] = -INFINITY;
      const float inv_tau = 1.0f / tau;
      std::vector<double> z(V), p(V);
      double m = -INFINITY;
      for (int v = 0; v < V; v++) m = std::max(m, z[v] = (double)logits[v] * inv_tau);
      double sum = 0.0;
      for (int v = 0; v < V; v++) sum += std::exp(z[v] - m);
      double H = 0.0;
      for (int v = 0; v < V; v++) {
        p[v] = std::exp(z[v] - m) / sum;
        if (p[v] > 0.0) H -= p[v] * std::log(p[v]);
      }
      const SoftmaxStats st = softmax_stats(logits.data(), V, inv_tau, true);
      worst_h = std::max(worst_h, std::fabs(st.entropy - H));
      std::vector<double> probs(V);
      softmax_probs(probs.data(), logits.data(), V, inv_tau, st);
      const int target = V / 2;
      const double d_logp = 0.8, d_entropy = -0.3, scale = 0.5;
      std::vector<float> g(V);
      logsoftmax_backward(g.data(), logits.data(), V, inv_tau, st, target, d_logp, d_entropy, scale);
      for (int v = 0; v < V; v++) {
        const double lp = z[v] - m - std::log(sum);
        if (p[v] > 0.0)
          worst_lp = std::max(worst_lp, std::fabs(st.logprob(logits.data(), v, inv_tau) - lp));
        worst_p = std::max(worst_p, std::fabs(probs[v] - p[v]));
        const double ref = scale * inv_tau *
                           (d_logp * ((v == target) - p[v]) -
                            d_entropy * (p[v] > 0.0 ? p[v] * (lp + H) : 0.0));
        worst_g = std::max(worst_g, std::fabs(g[v] - ref));
      }
    }
  }
  std::printf("softmax kernels vs fp64: log-prob %.2e, entropy %.2e, prob %.2e, gradient %.2e\n",
              worst_lp, worst_h, worst_p, worst_g);
  EXPECT_LT(worst_lp, 1e-13);
  EXPECT_LT(worst_h, 1e-13);
  EXPECT_LT(worst_p, 1e-14);
  EXPECT_LT(worst_g, 1e-7);  // fp32 gradients: their rounding
  auto logits = randn(40, 3);
  logits[20] = NAN;
  EXPECT_TRUE(std::isnan(softmax_stats(logits.data(), 40, 1.0f, true).log_sum));
}

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 11;
  c.max_seq_len = 8;
  c.dim = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_experts = 4;
  c.top_k = 2;
  c.expert_dim = 6;
  return c;
}

TEST(Model, WholeModelGradientMatchesFiniteDifferences) {
  ModelConfig cfg = tiny_config();
  transport::Communicator tc{transport::Config{}};
  ExpertComm comm(tc, cfg.num_experts);
  ParamStore ps(make_layout(cfg, 0, cfg.num_experts));
  // Larger-than-training init so every gradient is well above float32 rounding noise.
  // copy, not move-assign: the weight views point into the arenas
  auto d0 = randn(ps.dense.size(), 21, 0.5f), e0 = randn(ps.experts.size(), 22, 0.5f);
  std::copy(d0.begin(), d0.end(), ps.dense.begin());
  std::copy(e0.begin(), e0.end(), ps.experts.begin());
  const int B = 2, T = 6, V = cfg.vocab_size;
  std::vector<int32_t> tokens = {1, 4, 7, 2, 9, 3, 5, 5, 10, 0, 0, 0};
  std::vector<int32_t> lengths = {6, 3};
  std::vector<int32_t> targets(B * T, 0);
  std::vector<float> weights(B * T, 0.0f);
  for (int b = 0; b < B; b++)
    for (int t = 0; t + 1 < lengths[b]; t++) {
      targets[b * T + t] = tokens[b * T + t + 1];
      weights[b * T + t] = 1.0f / 7.0f;
    }
  const float aux_w = 0.1f, z_w = 0.01f;
  Activations a;
  auto loss = [&] {
    model_forward(ps, comm, tokens.data(), lengths.data(), B, T, a);
    return crossentropy_forward_backward(nullptr, a.logits.data(), targets.data(), weights.data(),
                                         B * T, V) +
           aux_w * a.aux_sum + z_w * a.z_sum;
  };
  loss();
  std::vector<float> dlogits(a.logits.size(), 0.0f);
  crossentropy_forward_backward(dlogits.data(), a.logits.data(), targets.data(), weights.data(),
                                B * T, V);
  ps.zero_grad();
  model_backward(ps, comm, dlogits.data(), aux_w, z_w, a);
  std::vector<float> gd = ps.grad_dense, ge = ps.grad_experts;
  double err_dense = fd_check(ps.dense, gd, loss, 1e-3f);
  double err_experts = fd_check(ps.experts, ge, loss, 1e-3f);
  std::printf("whole model fd: dense max rel err %.2e, experts %.2e\n", err_dense, err_experts);
  EXPECT_LT(err_dense, 2e-2);
  EXPECT_LT(err_experts, 2e-2);
}

// The LM head over named rows only (what the trainer and sampler ask for) gives the logits of
// those rows and the gradient of a loss that reads only them, as the head over every row does.
TEST(Model, LogitRowsGiveTheAllRowsLogitsAndGradients) {
  ModelConfig cfg = tiny_config();
  transport::Communicator tc{transport::Config{}};
  ExpertComm comm(tc, cfg.num_experts);
  ParamStore ps(make_layout(cfg, 0, cfg.num_experts));
  auto d0 = randn(ps.dense.size(), 31, 0.5f), e0 = randn(ps.experts.size(), 32, 0.5f);
  std::copy(d0.begin(), d0.end(), ps.dense.begin());
  std::copy(e0.begin(), e0.end(), ps.experts.begin());
  const int B = 2, T = 6, V = cfg.vocab_size;
  std::vector<int32_t> tokens = {1, 4, 7, 2, 9, 3, 5, 5, 10, 0, 0, 0}, lengths = {6, 3};
  const std::vector<int32_t> rows = {2, 3, 4, 6, 7};  // a loss on these positions only
  std::vector<int32_t> targets(B * T, 0);
  std::vector<float> weights(B * T, 0.0f);
  for (int r : rows) {
    targets[r] = tokens[r + 1];
    weights[r] = 0.2f;
  }
  Activations all, some;
  model_forward(ps, comm, tokens.data(), lengths.data(), B, T, all);
  std::vector<float> dlogits(all.logits.size(), 0.0f);
  crossentropy_forward_backward(dlogits.data(), all.logits.data(), targets.data(), weights.data(),
                                B * T, V);
  ps.zero_grad();
  model_backward(ps, comm, dlogits.data(), 0.1f, 0.01f, all);
  const std::vector<float> g_dense = ps.grad_dense, g_experts = ps.grad_experts;

  model_forward(ps, comm, tokens.data(), lengths.data(), B, T, some, &rows);
  ASSERT_EQ(some.logits.size(), rows.size() * V);
  std::vector<int32_t> some_targets;
  std::vector<float> some_weights(rows.size(), 0.2f);
  double max_logit_diff = 0.0;
  for (size_t j = 0; j < rows.size(); j++) {
    some_targets.push_back(targets[rows[j]]);
    for (int v = 0; v < V; v++)
      max_logit_diff = std::max(max_logit_diff, (double)std::fabs(some.logits[j * V + v] -
                                                                  all.logits[rows[j] * V + v]));
  }
  std::vector<float> some_dlogits(some.logits.size(), 0.0f);
  crossentropy_forward_backward(some_dlogits.data(), some.logits.data(), some_targets.data(),
                                some_weights.data(), (int)rows.size(), V);
  ps.zero_grad();
  model_backward(ps, comm, some_dlogits.data(), 0.1f, 0.01f, some);
  double max_grad_diff = 0.0, max_grad = 0.0;
  for (size_t i = 0; i < g_dense.size(); i++) {
    max_grad_diff = std::max(max_grad_diff, (double)std::fabs(ps.grad_dense[i] - g_dense[i]));
    max_grad = std::max(max_grad, (double)std::fabs(g_dense[i]));
  }
  for (size_t i = 0; i < g_experts.size(); i++) {
    max_grad_diff = std::max(max_grad_diff, (double)std::fabs(ps.grad_experts[i] - g_experts[i]));
    max_grad = std::max(max_grad, (double)std::fabs(g_experts[i]));
  }
  std::printf("logit rows vs all rows: logits %.2e, gradients %.2e (largest %.2e)\n",
              max_logit_diff, max_grad_diff, max_grad);
  EXPECT_LT(max_logit_diff, 1e-5);
  EXPECT_LT(max_grad_diff, 1e-5 * max_grad);
}

}  // namespace
}  // namespace moerl::model
