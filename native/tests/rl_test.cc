// RL pieces: the GRPO per-token loss gradient against finite differences (unclipped,
// clipped, asymmetric clip, the three KL estimators and entropy terms, truncated importance
// sampling), GSPO's and CISPO's gradients against their stop-gradient forms, mismatch_kl, the
// loss mask of multi-turn episodes (SFT and GRPO), the aggregation modes, the advantage
// estimators, and the learning-rate schedule.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "bad_input.h"
#include "rl/advantages.h"
#include "rl/adamw.h"
#include "rl/trainer.h"
#include "model/expert_comm.h"

namespace moerl::rl {
namespace {

struct Case {
  float advantage, old_shift, kl, entropy, temperature;
  float tis_clip = 0.0f, train_shift = 0.0f;  // TIS cap; trainer's old log-prob - current
  float clip_high = 0.2f;
  KlEstimator kl_estimator = KlEstimator::K3;
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
  lc.clip_high = c.clip_high;
  lc.kl_estimator = c.kl_estimator;
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
  EXPECT_EQ(t.clipped, c.advantage > 0 ? ratio > 1.0 + c.clip_high : ratio < 0.8);
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
                      Case{1.2f, -0.8f, 0.0f, 0.0f, 1.0f, 2.0f, -0.4f},
                      // clip-higher: ratio 1.22 within 1 + 0.28, ratio 1.35 beyond it
                      Case{1.0f, -0.2f, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.28f},
                      Case{1.0f, -0.3f, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.28f},
                      // the k1 and k2 estimators
                      Case{0.8f, 0.1f, 0.2f, 0.05f, 1.0f, 0.0f, 0.0f, 0.2f, KlEstimator::K1},
                      Case{-0.4f, -0.1f, 0.3f, 0.0f, 0.7f, 0.0f, 0.0f, 0.2f, KlEstimator::K2}));

// The token's row of logits and d logp(target) / d logits by central differences.
struct Row {
  static constexpr int V = 23, target = 4;
  std::vector<float> logits;
  Row() {
    std::mt19937 gen(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int v = 0; v < V; v++) logits.push_back(dist(gen));
  }
  std::vector<double> dlogp(const LossConfig& lc) {
    std::vector<double> g(V);
    for (int v = 0; v < V; v++) {
      const float eps = 1e-3f, keep = logits[v];
      logits[v] = keep + eps;
      const double up = grpo_token(logits.data(), V, target, 0, nullptr, 0, 0, lc, 1, nullptr).logprob;
      logits[v] = keep - eps;
      const double down = grpo_token(logits.data(), V, target, 0, nullptr, 0, 0, lc, 1, nullptr).logprob;
      logits[v] = keep;
      g[v] = (up - down) / (2 * eps);
    }
    return g;
  }
};

// CISPO: -w sg(clip(r, 1 - eps, 1 + eps_high)) A logp. Its gradient is the clipped weight
// times d logp, clipped or not: every token keeps a gradient.
TEST(Cispo, GradientIsTheClippedDetachedWeightTimesTheLogProbGradient) {
  Row row;
  LossConfig lc;
  lc.objective = Objective::Grpo;
  lc.policy_loss = PolicyLoss::Cispo;
  lc.clip_high = 0.3f;
  const std::vector<double> dlp = row.dlogp(lc);
  const double lp =
      grpo_token(row.logits.data(), Row::V, Row::target, 0, nullptr, 0, 0, lc, 1, nullptr).logprob;
  for (double shift : {0.1, -0.5, 0.5}) {  // ratios e^-0.1, e^0.5 (clipped at 1.3), e^-0.5 (0.8)
    const float old_lp = (float)(lp + shift);
    const double A = (double)0.7f, ratio = std::exp(lp - old_lp);
    const double weight = std::min(std::max(ratio, 1.0 - 0.2f), 1.0 + 0.3f);
    std::vector<float> grad(Row::V);
    GrpoTokenTerms t = grpo_token(row.logits.data(), Row::V, Row::target, old_lp, &old_lp, 0.0f,
                                  (float)A, lc, 1.0, grad.data());
    EXPECT_EQ(t.clipped, weight != ratio) << shift;
    EXPECT_NEAR(t.policy, -weight * A * lp, 1e-9);
    for (int v = 0; v < Row::V; v++) EXPECT_NEAR(grad[v], -weight * A * dlp[v], 2e-4) << v;
  }
}

// GSPO-token: each token carries the sequence ratio s = exp(seq_log_ratio); unclipped its
// gradient is -A s d logp, clipped (s beyond the range on the side A favours) none.
TEST(Gspo, TokensCarryTheSequenceRatioAndItsClip) {
  Row row;
  LossConfig lc;
  lc.objective = Objective::Grpo;
  lc.policy_loss = PolicyLoss::Gspo;
  lc.clip_eps = 3e-4f;
  lc.clip_high = 4e-4f;
  const std::vector<double> dlp = row.dlogp(lc);
  for (double seq : {1e-4, 1e-3, -1e-3}) {
    for (double A : {1.0, -1.0}) {
      std::vector<float> grad(Row::V);
      // the token's own ratio is far from the sequence's: only the sequence's counts
      GrpoTokenTerms t = grpo_token(row.logits.data(), Row::V, Row::target, -9.0f, nullptr, 0.0f,
                                    (float)A, lc, 1.0, grad.data(), seq);
      const double s = std::exp(seq), clipped = std::min(std::max(s, 1 - 3e-4), 1 + 4e-4);
      EXPECT_EQ(t.clipped, s * A > clipped * A) << seq << " " << A;
      EXPECT_NEAR(t.policy, -std::min(s * A, clipped * A), 1e-6);
      for (int v = 0; v < Row::V; v++)
        EXPECT_NEAR(grad[v], t.clipped ? 0.0 : -A * s * dlp[v], 2e-4) << seq << " " << A << " " << v;
    }
  }
}

TEST(Advantages, EachEstimatorFromItsFormulaAndEqualGroupsSkipped) {
  const std::vector<RewardGroup> groups = {{{1, 0, 0, 1}, {3, 5, 2, 2}},  // mean 0.5, std 0.5
                                           {{0.5f, 0.5f}, {1, 1}},        // no signal
                                           {{2, 0, 1}, {4, 4, 0}}};       // mean 1
  const auto norm = advantages(groups, AdvantageEstimator::GroupNorm);
  EXPECT_TRUE(norm[1].empty());
  EXPECT_NEAR(norm[0][0], 0.5 / (0.5 + 1e-6), 1e-6);
  EXPECT_NEAR(norm[2][1], -1.0 / (std::sqrt(2.0 / 3.0) + 1e-6), 1e-6);
  const auto mean = advantages(groups, AdvantageEstimator::GroupMean);
  EXPECT_EQ(mean[0], (std::vector<float>{0.5f, -0.5f, -0.5f, 0.5f}));
  const double mean2[] = {1, -1, 0};
  for (int k = 0; k < 3; k++) EXPECT_NEAR(mean[2][k], mean2[k], 1e-6);
  // leave one out: r - mean of the others
  const auto rloo = advantages(groups, AdvantageEstimator::Rloo);
  EXPECT_NEAR(rloo[0][0], 1.0 - 1.0 / 3.0, 1e-6);
  EXPECT_NEAR(rloo[2][0], 2.0 - 0.5, 1e-6);
  EXPECT_NEAR(rloo[2][2], 1.0 - 1.0, 1e-6);
  // REINFORCE++ baseline: r - mean, whitened over the kept samples weighted by their tokens
  const auto pp = advantages(groups, AdvantageEstimator::ReinforcePpBaseline);
  const double w[] = {3, 5, 2, 2, 4, 4, 0}, a[] = {0.5, -0.5, -0.5, 0.5, 1, -1, 0};
  double W = 0, mu = 0, var = 0;
  for (int i = 0; i < 7; i++) W += w[i], mu += w[i] * a[i];
  mu /= W;
  for (int i = 0; i < 7; i++) var += w[i] * (a[i] - mu) * (a[i] - mu) / W;
  EXPECT_TRUE(pp[1].empty());
  EXPECT_NEAR(pp[0][1], (-0.5 - mu) / std::sqrt(var + 1e-8), 1e-5);
  EXPECT_NEAR(pp[2][0], (1.0 - mu) / std::sqrt(var + 1e-8), 1e-5);
}

// The KL as a reward penalty: the estimator at d = ref - old over the trained tokens only.
TEST(SequenceKl, SumsTheEstimatorOverTheTrainedTokens) {
  TrainSequence s;
  s.tokens = {5, 6, 7, 8};
  s.prompt_len = 1;
  s.old_logprobs = {-1.0f, -2.0f, -0.5f};
  s.ref_logprobs = {-1.5f, -1.0f, -3.0f};
  s.loss_mask = {1, 0, 1};  // the middle token is an environment's
  const double d0 = -0.5, d2 = -2.5;
  EXPECT_NEAR(sequence_kl(s, KlEstimator::K1), -d0 - d2, 1e-12);
  EXPECT_NEAR(sequence_kl(s, KlEstimator::K2), 0.5 * (d0 * d0 + d2 * d2), 1e-12);
  EXPECT_NEAR(sequence_kl(s, KlEstimator::K3), std::exp(d0) - d0 - 1 + std::exp(d2) - d2 - 1, 1e-12);
  s.ref_logprobs.clear();  // not scored under the reference: a bug, not a zero penalty
  EXPECT_THROW(sequence_kl(s, KlEstimator::K1), moerl::Error);
}

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

// The loss mask on a tiny model, one rank: a sequence's summed gradient (the step's gradient
// times its trained tokens) is linear in the mask, an all-ones mask is no mask, and a masked
// token's id never reaches a gradient it does not feed as input.
class LossMask : public ::testing::TestWithParam<Objective> {
 protected:
  model::ModelConfig cfg = [] {
    model::ModelConfig c;
    c.vocab_size = 13;
    c.max_seq_len = 12;
    c.dim = 8;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_experts = 4;
    c.top_k = 2;
    c.expert_dim = 4;
    return c;
  }();
  transport::Communicator tc{transport::Config{}};
  model::ExpertComm comm{tc, cfg.num_experts};
  model::ParamStore ps{model::make_layout(cfg, 0, cfg.num_experts)};
  LossConfig lc;

  void SetUp() override {
    ps.init_random(7);
    lc.objective = GetParam();
    lc.aux_coef = 0.0f;  // the router losses do not depend on the mask
    lc.z_coef = 0.0f;
  }

  // Two sequences: prompt 3 tokens, completion 6.
  std::vector<TrainSequence> batch(const std::vector<uint8_t>& mask) const {
    std::vector<TrainSequence> b(2);
    for (int i = 0; i < 2; i++) {
      for (int t = 0; t < 9; t++) b[i].tokens.push_back((t * 5 + i * 3 + 1) % cfg.vocab_size);
      b[i].prompt_len = 3;
      for (int j = 0; j < 6; j++) b[i].old_logprobs.push_back(-2.0f - 0.1f * (float)j);
      b[i].advantage = i == 0 ? 0.7f : -0.4f;
      b[i].loss_mask = mask;
    }
    return b;
  }

  // The dense and expert gradients summed over trained tokens (not divided by their count).
  std::vector<double> summed_gradient(std::vector<TrainSequence> b) {
    const StepMetrics m = compute_gradients(ps, comm, b, lc);
    std::vector<double> g;
    for (float x : ps.grad_dense) g.push_back((double)x * m.tokens);
    for (float x : ps.grad_experts) g.push_back((double)x * m.tokens);
    return g;
  }
};

TEST_P(LossMask, GradientIsLinearInTheMaskAndAllOnesIsNoMask) {
  const std::vector<uint8_t> ones(6, 1), policy = {1, 1, 0, 0, 0, 1}, env = {0, 0, 1, 1, 1, 0};
  const std::vector<double> none = summed_gradient(batch({}));
  EXPECT_EQ(summed_gradient(batch(ones)), none) << "an all-ones mask is bitwise no mask";
  const std::vector<double> a = summed_gradient(batch(policy)), b = summed_gradient(batch(env));
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < none.size(); i++) {
    worst = std::max(worst, std::abs(a[i] + b[i] - none[i]));
    scale = std::max(scale, std::abs(none[i]));
  }
  EXPECT_GT(scale, 1e-3);
  EXPECT_LT(worst, 1e-5 * scale) << "G(mask) + G(1 - mask) = G(all)";
  double moved = 0.0;
  for (size_t i = 0; i < none.size(); i++) moved = std::max(moved, std::abs(a[i] - none[i]));
  EXPECT_GT(moved, 1e-3 * scale) << "the masked tokens contributed nothing";
}

TEST_P(LossMask, AMaskedLastTokenDoesNotReachTheGradient) {
  std::vector<TrainSequence> b = batch({1, 1, 1, 1, 1, 0});
  const std::vector<double> before = summed_gradient(b);
  for (TrainSequence& s : b) s.tokens.back() = (s.tokens.back() + 4) % cfg.vocab_size;
  // not bitwise: the changed token is still an input, routed to other experts, and an expert's
  // GEMM over another number of rows may block its sums otherwise (OpenBLAS's Haswell kernels)
  const std::vector<double> after = summed_gradient(b);
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < before.size(); i++) {
    worst = std::max(worst, std::abs(after[i] - before[i]));
    scale = std::max(scale, std::abs(before[i]));
  }
  EXPECT_GT(scale, 1e-3);
  EXPECT_LT(worst, 1e-6 * scale);
  std::vector<TrainSequence> masked = batch({1, 1, 1, 1, 1, 0});
  const StepMetrics m = compute_gradients(ps, comm, masked, lc);
  EXPECT_EQ(m.tokens, 2 * 5);
  if (lc.objective == Objective::Grpo) {
    ASSERT_EQ(masked[0].train_logprobs.size(), 6u);
    EXPECT_EQ(masked[0].train_logprobs[5], 0.0f);
    EXPECT_NE(masked[0].train_logprobs[4], 0.0f);
  }
}

TEST_P(LossMask, BadMasksAreBadInput) {
  std::vector<TrainSequence> short_mask = batch({1, 1, 0});
  EXPECT_NE(testing::bad_input([&] { compute_gradients(ps, comm, short_mask, lc); })
                .find("sequence 0: loss mask of 3 entries for 6 completion tokens"),
            std::string::npos);
  std::vector<TrainSequence> nothing = batch(std::vector<uint8_t>(6, 0));
  EXPECT_NE(testing::bad_input([&] { compute_gradients(ps, comm, nothing, lc); })
                .find("has no trained token"),
            std::string::npos);
}

// Each aggregation from the one-sequence token means G_i of sequences with n_1 = 5 and n_2 = 2
// trained tokens: token-mean (n_1 G_1 + n_2 G_2) / 7, seq-mean-token-sum (n_1 G_1 + n_2 G_2) / 2,
// seq-mean-token-mean (G_1 + G_2) / 2, seq-mean-token-sum-norm (n_1 G_1 + n_2 G_2) / (2 * 16).
class Aggregations : public LossMask {};

TEST_P(Aggregations, WeighTheSequencesTokenMeans) {
  std::vector<TrainSequence> both = batch({});
  both[0].loss_mask = {1, 1, 1, 0, 1, 1};
  both[1].loss_mask = {0, 1, 0, 0, 1, 0};
  auto gradient = [&](std::vector<TrainSequence> b, Aggregation agg) {
    LossConfig c = lc;
    c.aggregation = agg;
    c.norm_tokens = 16;
    compute_gradients(ps, comm, b, c);
    std::vector<double> g(ps.grad_dense.begin(), ps.grad_dense.end());
    g.insert(g.end(), ps.grad_experts.begin(), ps.grad_experts.end());
    return g;
  };
  const std::vector<double> g1 = gradient({both[0]}, Aggregation::TokenMean);
  const std::vector<double> g2 = gradient({both[1]}, Aggregation::TokenMean);
  const double n1 = 5, n2 = 2;
  const std::pair<Aggregation, std::array<double, 2>> cases[] = {
      {Aggregation::TokenMean, {n1 / 7, n2 / 7}},
      {Aggregation::SeqMeanTokenSum, {n1 / 2, n2 / 2}},
      {Aggregation::SeqMeanTokenMean, {0.5, 0.5}},
      {Aggregation::SeqMeanTokenSumNorm, {n1 / 32, n2 / 32}}};
  for (const auto& [agg, w] : cases) {
    const std::vector<double> g = gradient(both, agg);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < g.size(); i++) {
      worst = std::max(worst, std::abs(g[i] - (w[0] * g1[i] + w[1] * g2[i])));
      scale = std::max(scale, std::abs(g[i]));
    }
    EXPECT_GT(scale, 1e-4) << (int)agg;
    EXPECT_LT(worst, 1e-5 * scale) << (int)agg;
  }
  LossConfig no_norm = lc;
  no_norm.aggregation = Aggregation::SeqMeanTokenSumNorm;
  EXPECT_NE(testing::bad_input([&] { compute_gradients(ps, comm, both, no_norm); })
                .find("norm token count"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Grpo, Aggregations, ::testing::Values(Objective::Grpo));

INSTANTIATE_TEST_SUITE_P(Objectives, LossMask, ::testing::Values(Objective::Sft, Objective::Grpo),
                         [](const auto& info) {
                           return info.param == Objective::Sft ? std::string("Sft") : "Grpo";
                         });

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
