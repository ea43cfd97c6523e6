// RL pieces: the GRPO per-token loss gradient against finite differences (unclipped,
// clipped, KL and entropy terms, truncated importance sampling), mismatch_kl, and the
// learning-rate schedule.
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
  float tis_clip = 0.0f, train_shift = 0.0f;  // TIS cap; trainer's old log-prob - current
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
  lc.tis_clip = c.tis_clip;
  // behaviour log-prob = current log-prob + shift, so the ratio is exp(-shift); with TIS the
  // ratio is exp(-train_shift) and the weight exp(train_shift - old_shift)
  GrpoTokenTerms base = grpo_token(logits.data(), V, target, 0.0f, nullptr, 0.0f, c.advantage,
                                   lc, 1.0, nullptr);
  const float lp_now = (float)base.logprob;
  const float old_lp = lp_now + c.old_shift, ref_lp = lp_now - 0.3f;
  const float train_lp = lp_now + c.train_shift;
  auto token = [&](float* row, float* grad) {
    return grpo_token(row, V, target, old_lp, &train_lp, ref_lp, c.advantage, lc, 1.0, grad);
  };
  std::vector<float> grad(V, 0.0f);
  GrpoTokenTerms t = token(logits.data(), grad.data());
  // in place: the row of logits becomes the same gradient
  std::vector<float> row = logits;
  token(row.data(), row.data());
  EXPECT_EQ(row, grad);
  double max_err = 0.0;
  for (int v = 0; v < V; v++) {
    const float eps = 1e-3f, keep = logits[v];
    logits[v] = keep + eps;
    double lp = token(logits.data(), nullptr).loss;
    logits[v] = keep - eps;
    double lm = token(logits.data(), nullptr).loss;
    logits[v] = keep;
    max_err = std::max(max_err, std::fabs((lp - lm) / (2 * eps) - grad[v]));
  }
  EXPECT_LT(max_err, 2e-3) << "loss " << t.loss << " clipped " << t.clipped;
  const double ratio = std::exp(-(c.tis_clip > 0 ? c.train_shift : c.old_shift));
  EXPECT_EQ(t.clipped, c.advantage > 0 ? ratio > 1.2 : ratio < 0.8);
  const double d = (double)train_lp - old_lp;
  EXPECT_NEAR(t.mismatch_kl, std::exp(d) - 1 - d, 1e-12);
  EXPECT_EQ(t.tis_clipped, c.tis_clip > 0 && std::exp(d) > c.tis_clip);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GrpoToken,
    ::testing::Values(Case{1.0f, 0.0f, 0.0f, 0.0f, 1.0f},     // on-policy, positive advantage
                      Case{-0.7f, 0.05f, 0.0f, 0.0f, 1.0f},   // negative advantage, unclipped
                      Case{1.3f, -0.5f, 0.0f, 0.0f, 1.0f},    // ratio 1.65 > 1.2: clipped
                      Case{-1.0f, 0.5f, 0.0f, 0.0f, 1.0f},    // ratio 0.61 < 0.8: clipped
                      Case{0.8f, 0.1f, 0.2f, 0.05f, 1.0f},    // KL and entropy terms
                      Case{-0.4f, -0.1f, 0.1f, 0.02f, 0.7f},   // temperature
                      // TIS: weight 1.35 under the cap 2; truncated (e^1.2 = 3.3 > 2), once with
                      // the PPO clip taken (ratio e^0.4 = 1.49, A > 0)
                      Case{0.9f, -0.2f, 0.0f, 0.0f, 1.0f, 2.0f, 0.1f},
                      Case{-1.1f, -1.3f, 0.05f, 0.01f, 0.9f, 2.0f, -0.1f},
                      Case{1.2f, -0.8f, 0.0f, 0.0f, 1.0f, 2.0f, -0.4f}));

// The token's first forward: the trainer's old log-prob is its own, so the ratio is 1 and the
// policy term is -w A with w = min(p_train / p_rollout, C).
TEST(GrpoTis, FirstForwardWeighsByTheTruncatedRatioToTheRollout) {
  const int V = 19, target = 5;
  std::vector<float> logits(V);
  for (int v = 0; v < V; v++) logits[v] = 0.1f * (float)((v * 7) % 11);
  LossConfig lc;
  lc.objective = Objective::Grpo;
  lc.tis_clip = 2.0f;
  const double lp =
      grpo_token(logits.data(), V, target, 0.0f, nullptr, 0.0f, 1.0f, lc, 1.0, nullptr).logprob;
  for (double shift : {0.3, -0.3, -1.0}) {  // rollout log-prob = lp + shift
    const float old_lp = (float)(lp + shift);
    GrpoTokenTerms t = grpo_token(logits.data(), V, target, old_lp, nullptr, 0.0f, 1.5f, lc, 1.0,
                                  nullptr);
    const double d = (double)(float)lp - old_lp;
    EXPECT_NEAR(t.policy, -1.5 * std::min(std::exp(d), 2.0), 1e-6) << shift;
    EXPECT_EQ(t.tis_clipped, std::exp(d) > 2.0) << shift;
    EXPECT_FALSE(t.clipped);
  }
  // off: the ratio is to the rollout's log-prob, weight 1
  lc.tis_clip = 0.0f;
  GrpoTokenTerms t = grpo_token(logits.data(), V, target, (float)(lp - 0.1), nullptr, 0.0f, -1.0f,
                                lc, 1.0, nullptr);
  EXPECT_NEAR(t.policy, std::exp(0.1), 1e-6);
  EXPECT_FALSE(t.tis_clipped);
}

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
