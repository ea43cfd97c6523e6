// The kernel variants (kernels.h): every variant this CPU runs gives the bits of the baseline
// one, on shapes with and without a 16-lane tail; the few-row matmul agrees with OpenBLAS to
// rounding and gives a row the same bits whatever rows share its call and whatever the weight's
// row stride.
#include <gtest/gtest.h>

#include <cblas.h>  // cblas_sgemm, the reference of matmul_small

#include <algorithm>  // std::copy_n
#include <cmath>
#include <cstdio>
#include <cstring>  // std::memcmp
#include <random>
#include <vector>

#include "model/kernels.h"

namespace moerl::model {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Everything one variant computes on a fixed set of inputs, as floats.
std::vector<float> outputs(const Kernels& k) {
  std::vector<float> out;
  for (int V : {5, 16, 37, 1000}) {
    const auto logits = randn(V, 100 + V, 4.0f);
    for (float inv_tau : {1.0f, 1.3f}) {
      const SoftmaxStats st = k.softmax_stats(logits.data(), V, inv_tau, true);
      out.push_back(st.max_logit);
      for (double x : {st.log_sum, st.entropy}) {
        float h[2];
        std::memcpy(h, &x, sizeof x);
        out.insert(out.end(), h, h + 2);
      }
      std::vector<double> p(V);
      std::vector<float> g(V);
      k.softmax_probs(p.data(), logits.data(), V, inv_tau, st);
      k.logsoftmax_backward(g.data(), logits.data(), V, inv_tau, st, V / 3, 0.7, -0.2, 0.01);
      for (double x : p) {  // both halves of the fp64 bits
        float h[2];
        std::memcpy(h, &x, sizeof x);
        out.insert(out.end(), h, h + 2);
      }
      out.insert(out.end(), g.begin(), g.end());
    }
  }
  for (int n : {7, 16, 53}) {
    const auto h1 = randn(n, n, 4.0f), h3 = randn(n, n + 1), g = randn(n, n + 2);
    std::vector<float> act(n), d1 = randn(n, n + 3), d3 = randn(n, n + 4);
    k.swiglu_forward(act.data(), h1.data(), h3.data(), n);
    k.swiglu_backward(d1.data(), d3.data(), g.data(), h1.data(), h3.data(), n);
    for (const auto* v : {&act, &d1, &d3}) out.insert(out.end(), v->begin(), v->end());
  }
  for (int len : {1, 9, 40}) {
    const int G = 3, D = 20, ldv = 27;
    auto scores = randn((size_t)G * len, len, 3.0f);
    const auto v = randn((size_t)len * ldv, len + 1);
    std::vector<float> o((size_t)G * 24, 0.0f);
    k.attend_cached(o.data(), 24, scores.data(), v.data(), ldv, G, len, D, 0.125f);
    out.insert(out.end(), o.begin(), o.end());
    out.insert(out.end(), scores.begin(), scores.end());
  }
  for (int N : {1, 3, 8, 32})
    for (int IC : {8, 48, 70}) {
      const int OC = 13;
      const auto x = randn((size_t)N * IC, N + IC), w = randn((size_t)OC * IC, 7 * IC);
      std::vector<float> y((size_t)N * OC);
      k.matmul_small(y.data(), x.data(), w.data(), N, IC, OC, IC);
      out.insert(out.end(), y.begin(), y.end());
      k.matmul_small_fma(y.data(), x.data(), w.data(), N, IC, OC, IC);
      out.insert(out.end(), y.begin(), y.end());
    }
  return out;
}

TEST(Kernels, VariantsGiveTheSameBits) {
  const std::vector<const Kernels*> variants = runnable_kernels();
  ASSERT_STREQ(variants[0]->name, "baseline");
  const std::vector<float> base = outputs(*variants[0]);
  for (const Kernels* k : variants) {
    std::printf("kernel variant %s (this process uses %s)\n", k->name, kernels().name);
    EXPECT_TRUE(same_bits(outputs(*k), base)) << k->name << " differs from baseline";
  }
}

TEST(Kernels, MatmulSmallMatchesSgemmAndKeepsEachRowsBits) {
  const int IC = 200, OC = 37;
  const auto w = randn((size_t)OC * IC, 5, 0.1f);
  const auto x = randn((size_t)32 * IC, 6);
  for (const Kernels* k : runnable_kernels()) {
    std::vector<float> all(32 * OC), ref(32 * OC);
    k->matmul_small(all.data(), x.data(), w.data(), 32, IC, OC, IC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 32, OC, IC, 1.0f, x.data(), IC, w.data(),
                IC, 0.0f, ref.data(), OC);
    double worst = 0.0;
    for (size_t i = 0; i < all.size(); i++)
      worst = std::max(worst, (double)std::fabs(all[i] - ref[i]));
    EXPECT_LT(worst, 1e-5) << k->name;
    // row 11 alone, and rows 9..13: the same bits as in the call with all 32 rows
    std::vector<float> one(OC), five(5 * OC);
    k->matmul_small(one.data(), x.data() + 11 * IC, w.data(), 1, IC, OC, IC);
    k->matmul_small(five.data(), x.data() + 9 * IC, w.data(), 5, IC, OC, IC);
    EXPECT_TRUE(same_bits(one, std::vector<float>(all.begin() + 11 * OC, all.begin() + 12 * OC)));
    EXPECT_TRUE(same_bits(five, std::vector<float>(all.begin() + 9 * OC, all.begin() + 14 * OC)));
    // the weight's rows at a stride of IC + 9 (a KV cache's): the same bits
    std::vector<float> wide((size_t)OC * (IC + 9), NAN), strided(32 * OC);
    for (int o = 0; o < OC; o++) std::copy_n(w.data() + o * IC, IC, wide.data() + o * (IC + 9));
    k->matmul_small(strided.data(), x.data(), wide.data(), 32, IC, OC, IC + 9);
    EXPECT_TRUE(same_bits(strided, all)) << k->name;
    // the fused form: as close to sgemm, and a row's bits again independent of the others
    std::vector<float> fused(32 * OC), fused_one(OC);
    k->matmul_small_fma(fused.data(), x.data(), w.data(), 32, IC, OC, IC);
    k->matmul_small_fma(fused_one.data(), x.data() + 11 * IC, w.data(), 1, IC, OC, IC);
    worst = 0.0;
    for (size_t i = 0; i < fused.size(); i++)
      worst = std::max(worst, (double)std::fabs(fused[i] - ref[i]));
    EXPECT_LT(worst, 1e-5) << k->name;
    EXPECT_TRUE(same_bits(fused_one, std::vector<float>(fused.begin() + 11 * OC, fused.begin() + 12 * OC)));
  }
}

TEST(Kernels, AttendCachedMatchesFp64) {
  const int G = 4, len = 37, D = 24, ldv = 30;
  const float scale = 0.2f;
  const auto q_k = randn((size_t)G * len, 9, 4.0f), v = randn((size_t)len * ldv, 10);
  for (const Kernels* k : runnable_kernels()) {
    std::vector<float> scores = q_k, o((size_t)G * D);
    k->attend_cached(o.data(), D, scores.data(), v.data(), ldv, G, len, D, scale);
    double worst = 0.0;
    for (int g = 0; g < G; g++) {
      double m = -INFINITY, sum = 0.0;
      for (int s = 0; s < len; s++) m = std::max(m, (double)q_k[g * len + s] * scale);
      for (int s = 0; s < len; s++) sum += std::exp(q_k[g * len + s] * scale - m);
      for (int d = 0; d < D; d++) {
        double ref = 0.0;
        for (int s = 0; s < len; s++)
          ref += std::exp(q_k[g * len + s] * scale - m) / sum * v[s * ldv + d];
        worst = std::max(worst, std::fabs(o[g * D + d] - ref));
      }
    }
    EXPECT_LT(worst, 1e-6) << k->name;
  }
}

TEST(Kernels, SwigluMatchesFp64) {
  const int n = 1000;
  const auto h1 = randn(n, 1, 6.0f), h3 = randn(n, 2), g = randn(n, 3);
  for (const Kernels* k : runnable_kernels()) {
    std::vector<float> act(n), d1(n, 0.0f), d3(n, 0.0f);
    k->swiglu_forward(act.data(), h1.data(), h3.data(), n);
    k->swiglu_backward(d1.data(), d3.data(), g.data(), h1.data(), h3.data(), n);
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
      const double a = h1[i], sig = 1.0 / (1.0 + std::exp(-a));
      const double ref[3] = {a * sig * h3[i], g[i] * h3[i] * sig * (1.0 + a * (1.0 - sig)),
                             g[i] * a * sig};
      const float got[3] = {act[i], d1[i], d3[i]};
      for (int j = 0; j < 3; j++)
        worst = std::max(worst, std::fabs(got[j] - ref[j]) / std::max(1.0, std::fabs(ref[j])));
    }
    EXPECT_LT(worst, 1e-6) << k->name;
  }
}

}  // namespace
}  // namespace moerl::model
