// Expert-parallel generation: the real moe_generate on 2 ranks (separate processes, shm
// provider, experts sharded 2+2, each MoE layer of each decode step through the low-latency
// buffer) is byte-identical across runs, after a resume and over tcp, and samples the same
// tokens as one rank, with log-probs within GEMM rounding (a rank's dense GEMMs see half the
// rows); with --max-batch (continuous batching) it samples the all-at-once tokens and is
// byte-identical across runs.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ep_spawn.h"
#include "io/checkpoint.h"
#include "io/json.h"

namespace moerl {
namespace {

namespace fs = std::filesystem;
using ep::testing::describe;
using ep::testing::run_ranks;

void run(int world, const std::vector<std::string>& args, const std::string& provider = "shm") {
  auto results = run_ranks(world, provider, 30, args, 120);
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
}

std::vector<io::Json> records(const std::string& path) {
  std::vector<io::Json> out;
  std::istringstream in(io::read_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(io::parse_json(line, path));
  return out;
}

TEST(ModelEpGenerate, TwoRanksLowLatencyAreReproducibleAndSampleOneRanksTokens) {
  const std::string w = ::testing::TempDir() + "moerl-ep-generate-" + std::to_string(::getpid());
  const std::string train = MOERL_MOE_TRAIN, gen = MOERL_MOE_GENERATE;
  // top-k 3 of 4 experts: each token's reduction has three terms, so the order matters
  run(1, {train, "init", "--out", w + "/init", "--seed", "9", "--dim", "32", "--heads", "2",
          "--experts", "4", "--top-k", "3", "--expert-dim", "32"});
  // 10 prompts x 3 samples in chunks of 4 prompts: 12, 12 and 6 samples, split 6/6, 6/6, 3/3
  const std::vector<std::string> base = {gen, "--checkpoint", w + "/init", "--task", "sort",
                                         "--num-prompts", "10", "--samples", "3", "--chunk-size",
                                         "4", "--seed", "77", "--iteration", "2", "--top-p", "0.95"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  run(1, with({"--out-dir", w + "/one"}));
  run(2, with({"--out-dir", w + "/two-a"}));
  run(2, with({"--out-dir", w + "/two-b"}));
  run(2, with({"--out-dir", w + "/two-resumed", "--start-chunk", "1"}));
  run(2, with({"--out-dir", w + "/two-tcp"}), "tcp");
  run(2, with({"--out-dir", w + "/two-normal", "--ep-mode", "normal"}));
  // continuous batching: 4 slots per rank for shares of 6, 6 and 3 samples
  run(2, with({"--out-dir", w + "/two-b4-a", "--max-batch", "4"}));
  run(2, with({"--out-dir", w + "/two-b4-b", "--max-batch", "4"}));
  EXPECT_FALSE(fs::exists(w + "/two-resumed/chunk-0.jsonl"));
  EXPECT_FALSE(fs::exists(w + "/two-a/chunk-3.jsonl"));

  double max_dlogprob = 0.0, max_dlogprob_b4 = 0.0;
  int samples = 0;
  std::set<size_t> lengths;
  for (int k : {0, 1, 2}) {
    const std::string name = "/chunk-" + std::to_string(k) + ".jsonl";
    const std::string a = io::read_file(w + "/two-a" + name);
    EXPECT_EQ(a, io::read_file(w + "/two-b" + name)) << name << ": same R, two runs";
    EXPECT_EQ(a, io::read_file(w + "/two-tcp" + name)) << name << ": tcp vs shm";
    EXPECT_EQ(io::read_file(w + "/two-b4-a" + name), io::read_file(w + "/two-b4-b" + name))
        << name << ": --max-batch 4, two runs";
    if (k > 0) {
      EXPECT_EQ(a, io::read_file(w + "/two-resumed" + name)) << name << ": resumed";
    }
    std::vector<io::Json> one = records(w + "/one" + name), two = records(w + "/two-a" + name),
                          normal = records(w + "/two-normal" + name),
                          b4 = records(w + "/two-b4-a" + name);
    ASSERT_EQ(one.size(), k < 2 ? 12u : 6u) << name;
    ASSERT_EQ(two.size(), one.size()) << name;
    ASSERT_EQ(normal.size(), one.size()) << name;
    ASSERT_EQ(b4.size(), one.size()) << name;
    for (size_t i = 0; i < one.size(); i++) {
      const std::string what = name + " record " + std::to_string(i);
      EXPECT_EQ(two[i]["prompt_id"], one[i]["prompt_id"]) << what;
      EXPECT_EQ(two[i]["sample_index"], one[i]["sample_index"]) << what;
      EXPECT_EQ(two[i]["tokens"], one[i]["tokens"]) << what << ": ll, 2 ranks vs 1";
      EXPECT_EQ(normal[i]["tokens"], one[i]["tokens"]) << what << ": normal, 2 ranks vs 1";
      EXPECT_EQ(b4[i]["tokens"], two[i]["tokens"]) << what << ": --max-batch 4 vs all at once";
      EXPECT_EQ(two[i]["finish_reason"], one[i]["finish_reason"]) << what;
      EXPECT_EQ(b4[i]["finish_reason"], two[i]["finish_reason"]) << what;
      const io::Json::array_t& la = io::array_field(one[i], "logprobs", what);
      const io::Json::array_t& lb = io::array_field(two[i], "logprobs", what);
      ASSERT_EQ(la.size(), lb.size()) << what;
      const io::Json::array_t& lc = io::array_field(b4[i], "logprobs", what);
      ASSERT_EQ(lc.size(), lb.size()) << what;
      lengths.insert(la.size());
      for (size_t t = 0; t < la.size(); t++) {
        max_dlogprob = std::max(max_dlogprob, std::fabs(la[t].get<double>() - lb[t].get<double>()));
        max_dlogprob_b4 =
            std::max(max_dlogprob_b4, std::fabs(lc[t].get<double>() - lb[t].get<double>()));
      }
      samples++;
    }
  }
  std::printf("2 ranks (ll) vs 1 rank: %d samples, same tokens, max |d logprob| %.3e\n", samples,
              max_dlogprob);
  EXPECT_LT(max_dlogprob, 1e-5);
  std::printf("2 ranks, --max-batch 4 vs all at once: same tokens, max |d logprob| %.3e, %zu "
              "distinct lengths\n",
              max_dlogprob_b4, lengths.size());
  EXPECT_LT(max_dlogprob_b4, 1e-5);
  EXPECT_GT(lengths.size(), 1u) << "lengths should vary, so that slots are reused mid-chunk";

  // the recompute path has no EP decode: bad input on 2 ranks, exit 2 on every rank
  auto bad = run_ranks(2, "shm", 30, with({"--out-dir", w + "/x", "--no-kv-cache"}), 60);
  for (const auto& r : bad) EXPECT_EQ(r.exit_code, 2) << describe(bad);
  fs::remove_all(w);
}

}  // namespace
}  // namespace moerl
