// Sampler: bit-identical regeneration (same requests, same batch), tokens independent of
// the batch's other samples, of continuous batching and of the KV cache (log-probs there:
// equal up to rounding).
#include <gtest/gtest.h>

#include <algorithm>  // std::max, std::min
#include <cstdint>    // SIZE_MAX
#include <cmath>      // std::fabs
#include <cstdio>     // std::printf

#include "model/sampler.h"
#include "tasks/tokenizer.h"

namespace moerl::model {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = tasks::kVocabSize;
  c.max_seq_len = 32;
  c.dim = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_experts = 4;
  c.top_k = 2;
  c.expert_dim = 16;
  return c;
}

std::vector<SampleRequest> requests(int n, int first_prompt) {
  const char* prompts[] = {"12+34=", "sort:9382=", "rev:abc=", "7+8=", "rev:hello="};
  std::vector<SampleRequest> r;
  for (int i = 0; i < n; i++) {
    int pid = first_prompt + i;
    r.push_back({tasks::encode(prompts[pid % 5]), sample_seed(42, 3, pid, 0)});
  }
  return r;
}

// Log-probs that must agree up to float rounding. The scaled init below gives large logits,
// so rounding reaches ~2e-4 here (a batch's prefill step puts its prompts' rows through OpenBLAS,
// whose rounding follows the row count); the demo policy's differ by ~5e-7
// (docs/native-model.md).
constexpr double kRoundingTolerance = 5e-4;

struct SamplerTest : ::testing::Test {
  ModelConfig cfg = small_config();
  transport::Communicator tc{transport::Config{}};
  ExpertComm comm{tc, cfg.num_experts};
  ParamStore ps{make_layout(cfg, 0, cfg.num_experts)};
  // A large init std makes sampled tokens vary, which is what the determinism tests need.
  SamplerTest() {
    ps.init_random(7);
    for (float& x : ps.dense) x *= 20.0f;
    for (float& x : ps.experts) x *= 20.0f;
  }
};

TEST_F(SamplerTest, RegeneratedSamplesAreBitIdentical) {
  SampleParams sp;
  sp.temperature = 1.0f;
  sp.top_p = 0.9f;
  sp.max_new_tokens = 12;
  std::vector<SampleResult> a, b;
  generate(ps, comm, requests(8, 0), sp, a);
  generate(ps, comm, requests(8, 0), sp, b);
  bool any_diverse = false;
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size());
    for (size_t j = 0; j < a[i].logprobs.size(); j++)
      EXPECT_EQ(a[i].logprobs[j], b[i].logprobs[j]);  // bitwise, not approximately
    any_diverse |= a[i].tokens != a[0].tokens;
  }
  EXPECT_TRUE(any_diverse) << "samples should differ from each other";
}

TEST_F(SamplerTest, SampleDoesNotDependOnItsBatchNeighbours) {
  SampleParams sp;
  sp.max_new_tokens = 10;
  std::vector<SampleResult> full, tail;
  generate(ps, comm, requests(8, 0), sp, full);
  generate(ps, comm, requests(3, 5), sp, tail);  // samples 5..7 alone, in a smaller batch
  // Tokens are equal; log-probs only up to summation order, because the GEMMs' row count and
  // the rows grouped per expert change with the batch (docs/native-model.md, "Sampler").
  double max_diff = 0.0;
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(full[5 + i].tokens, tail[i].tokens) << "sample " << 5 + i;
    for (size_t j = 0; j < tail[i].logprobs.size(); j++)
      max_diff = std::max(max_diff, std::fabs((double)full[5 + i].logprobs[j] - tail[i].logprobs[j]));
  }
  std::printf("batch neighbours: max |log-prob difference| %.3g\n", max_diff);
  EXPECT_LT(max_diff, kRoundingTolerance);
}

// Continuous batching: 3 slots for 8 requests of varied lengths (sampling stops at <eos>),
// so finished samples' slots are taken by later requests. Each sample owns its RNG: the
// tokens are those of the all-at-once batch; log-probs only up to rounding (the GEMMs see
// other row counts); the same max_batch regenerates bit-identical samples.
TEST_F(SamplerTest, ContinuousBatchingSamplesTheAllAtOnceTokens) {
  SampleParams sp;
  sp.top_p = 0.9f;
  sp.max_new_tokens = 12;
  sp.eos_ids = {};
  std::vector<SampleResult> all, cont, again;
  generate(ps, comm, requests(8, 0), sp, all);
  sp.eos_ids = {all[0].tokens[3]};  // a token sampled early on: sample 0 at least stops early
  generate(ps, comm, requests(8, 0), sp, all);
  sp.max_batch = 3;
  generate(ps, comm, requests(8, 0), sp, cont);
  generate(ps, comm, requests(8, 0), sp, again);
  ASSERT_EQ(cont.size(), all.size());
  double max_diff = 0.0;
  size_t shortest = SIZE_MAX, longest = 0;
  for (size_t i = 0; i < all.size(); i++) {
    EXPECT_EQ(cont[i].tokens, all[i].tokens) << "sample " << i;
    EXPECT_EQ(cont[i].stopped, all[i].stopped) << "sample " << i;
    ASSERT_EQ(cont[i].logprobs.size(), all[i].logprobs.size()) << "sample " << i;
    for (size_t j = 0; j < all[i].logprobs.size(); j++)
      max_diff = std::max(max_diff, std::fabs((double)cont[i].logprobs[j] - all[i].logprobs[j]));
    EXPECT_EQ(again[i].tokens, cont[i].tokens) << "sample " << i;
    ASSERT_EQ(again[i].logprobs.size(), cont[i].logprobs.size());
    for (size_t j = 0; j < cont[i].logprobs.size(); j++)
      EXPECT_EQ(again[i].logprobs[j], cont[i].logprobs[j]);  // bitwise
    shortest = std::min(shortest, all[i].tokens.size());
    longest = std::max(longest, all[i].tokens.size());
  }
  EXPECT_LT(shortest, longest) << "lengths should vary, so that slots are reused mid-run";
  std::printf("max_batch 3 vs all at once: max |log-prob difference| %.3g\n", max_diff);
  EXPECT_LT(max_diff, kRoundingTolerance);
}

TEST_F(SamplerTest, KvCacheMatchesRecomputation) {
  SampleParams sp;
  sp.temperature = 0.0f;
  sp.max_new_tokens = 12;
  std::vector<SampleResult> cached, recomputed;
  generate(ps, comm, requests(5, 0), sp, cached);
  sp.use_kv_cache = false;
  generate(ps, comm, requests(5, 0), sp, recomputed);
  double max_diff = 0.0;
  for (size_t i = 0; i < cached.size(); i++) {
    EXPECT_EQ(cached[i].tokens, recomputed[i].tokens);
    for (size_t j = 0; j < cached[i].logprobs.size(); j++)
      max_diff = std::max(max_diff, std::fabs((double)cached[i].logprobs[j] - recomputed[i].logprobs[j]));
  }
  std::printf("KV cache vs recompute: max |log-prob difference| %.3g\n", max_diff);
  EXPECT_LT(max_diff, kRoundingTolerance);
}

TEST_F(SamplerTest, TopKOneAndTinyTopPAreGreedy) {
  SampleParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_new_tokens = 8;
  SampleParams k1 = greedy, p0 = greedy;
  k1.temperature = p0.temperature = 1.0f;
  k1.top_k = 1;
  p0.top_p = 1e-6f;
  std::vector<SampleResult> g, a, b;
  generate(ps, comm, requests(5, 0), greedy, g);
  generate(ps, comm, requests(5, 0), k1, a);
  generate(ps, comm, requests(5, 0), p0, b);
  for (size_t i = 0; i < g.size(); i++) {
    EXPECT_EQ(a[i].tokens, g[i].tokens);
    EXPECT_EQ(b[i].tokens, g[i].tokens);
  }
}

TEST(SampleSeed, DependsOnEveryId) {
  uint64_t base = sample_seed(1, 2, 3, 4);
  EXPECT_EQ(base, sample_seed(1, 2, 3, 4));
  EXPECT_NE(base, sample_seed(9, 2, 3, 4));
  EXPECT_NE(base, sample_seed(1, 9, 3, 4));
  EXPECT_NE(base, sample_seed(1, 2, 9, 4));
  EXPECT_NE(base, sample_seed(1, 2, 3, 9));
}

}  // namespace
}  // namespace moerl::model
