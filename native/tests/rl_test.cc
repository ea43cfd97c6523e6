// RL pieces: the GRPO per-token loss gradient against finite differences (unclipped,
// clipped, KL and entropy terms), and the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "rl/adamw.h"
#include "rl/trainer.h"

namespace moerl::rl {
namespace {

struct Case {
  float advantage, old_shift, kl, entropy, temperature;
};

class GrpoToken : public ::testing::TestWithParam<Case> {};

TEST_P(GrpoToken, GradientMatchesFiniteDifferences) {
  const Case c = GetParam();
  const int V = 37, target = 3;  // two 16-lane blocks and a tail
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> logits(V);
  for (float& x : logits) x = dist(gen);
  LossConfig lc;
  lc.objective = Objective::Grpo;
  lc.kl_coef = c.kl;
  lc.entropy_coef = c.entropy;
  lc.temperature = c.temperature;
  // behaviour log-prob = current log-prob + shift, so the ratio is exp(-shift)
  GrpoTokenTerms base = grpo_token(logits.data(), V, target, 0.0f, 0.0f, c.advantage, lc, 1.0,
                                   nullptr);
  const float lp_now = (float)base.logprob;
  const float old_lp = lp_now + c.old_shift, ref_lp = lp_now - 0.3f;
  std::vector<float> grad(V, 0.0f);
  GrpoTokenTerms t = grpo_token(logits.data(), V, target, old_lp, ref_lp, c.advantage, lc, 1.0,
                                grad.data());
  // in place: the row of logits becomes the same gradient
  std::vector<float> row = logits;
  grpo_token(row.data(), V, target, old_lp, ref_lp, c.advantage, lc, 1.0, row.data());
  EXPECT_EQ(row, grad);
  double max_err = 0.0;
  for (int v = 0; v < V; v++) {
    const float eps = 1e-3f, keep = logits[v];
    logits[v] = keep + eps;
    double lp = grpo_token(logits.data(), V, target, old_lp, ref_lp, c.advantage, lc, 1.0, nullptr).loss;
    logits[v] = keep - eps;
    double lm = grpo_token(logits.data(), V, target, old_lp, ref_lp, c.advantage, lc, 1.0, nullptr).loss;
    logits[v] = keep;
    max_err = std::max(max_err, std::fabs((lp - lm) / (2 * eps) - grad[v]));
  }
  EXPECT_LT(max_err, 2e-3) << "loss " << t.loss << " clipped " << t.clipped;
  EXPECT_EQ(t.clipped, c.advantage > 0 ? std::exp(-c.old_shift) > 1.2 : std::exp(-c.old_shift) < 0.8);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GrpoToken,
    ::testing::Values(Case{1.0f, 0.0f, 0.0f, 0.0f, 1.0f},     // on-policy, positive advantage
                      Case{-0.7f, 0.05f, 0.0f, 0.0f, 1.0f},   // negative advantage, unclipped
                      Case{1.3f, -0.5f, 0.0f, 0.0f, 1.0f},    // ratio 1.65 > 1.2: clipped
                      Case{-1.0f, 0.5f, 0.0f, 0.0f, 1.0f},    // ratio 0.61 < 0.8: clipped
                      Case{0.8f, 0.1f, 0.2f, 0.05f, 1.0f},    // KL and entropy terms
                      Case{-0.4f, -0.1f, 0.1f, 0.02f, 0.7f}));  // temperature

TEST(Schedule, WarmupThenCosineToFloor) {
  AdamWConfig c;
  c.lr = 1.0f;
  c.warmup_steps = 4;
  c.decay_steps = 10;
  c.min_lr_ratio = 0.1f;
  EXPECT_FLOAT_EQ(lr_at(c, 0), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(c, 3), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(c, 4), 1.0f);
  EXPECT_NEAR(lr_at(c, 9), 0.55f, 1e-6);
  EXPECT_NEAR(lr_at(c, 14), 0.1f, 1e-6);
  EXPECT_NEAR(lr_at(c, 100), 0.1f, 1e-6);
  c.decay_steps = 0;
  EXPECT_FLOAT_EQ(lr_at(c, 100), 1.0f);
}

}  // namespace
}  // namespace moerl::rl
