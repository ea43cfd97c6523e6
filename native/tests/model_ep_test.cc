// Expert parallel vs single rank: the real tools (moe_train, moe_generate, moe_reward) run
// SFT and GRPO steps once on 1 rank and once on 2 ranks (separate processes, shm provider,
// experts sharded 2+2); losses per step and the final weights must agree within tolerance.
// The 2-rank checkpoint is loaded by a 1-rank layout, which also covers re-sharding.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
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

std::string work_dir() {
  std::string d = ::testing::TempDir() + "moerl-model-ep-" + std::to_string(::getpid());
  fs::create_directories(d);
  return d;
}

void run(int world, const std::vector<std::string>& args) {
  auto results = run_ranks(world, "shm", 30, args, 120);
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
}

std::vector<double> losses(const std::string& metrics_path) {
  std::vector<double> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) out.push_back(io::number_field(io::parse_json(line, metrics_path), "loss", metrics_path));
  return out;
}

// Largest |a-b| over all parameters of two checkpoints, both loaded on one rank.
double max_weight_diff(const std::string& a, const std::string& b) {
  model::ModelConfig cfg = io::read_checkpoint_config(a);
  model::ParamStore pa(model::make_layout(cfg, 0, cfg.num_experts));
  model::ParamStore pb(pa.layout);
  io::load_weights(a, pa);
  io::load_weights(b, pb);
  double d = 0.0;
  for (size_t i = 0; i < pa.dense.size(); i++) d = std::max(d, (double)std::fabs(pa.dense[i] - pb.dense[i]));
  for (size_t i = 0; i < pa.experts.size(); i++)
    d = std::max(d, (double)std::fabs(pa.experts[i] - pb.experts[i]));
  return d;
}

TEST(ModelEp, TwoRanksMatchOneRankForSftAndGrpo) {
  const std::string w = work_dir();
  const std::string train = MOERL_MOE_TRAIN, gen = MOERL_MOE_GENERATE, reward = MOERL_MOE_REWARD;
  run(1, {train, "init", "--out", w + "/init", "--seed", "5", "--dim", "32", "--layers", "2",
          "--heads", "2", "--experts", "4", "--top-k", "2", "--expert-dim", "32"});
  // SFT: 3 steps of 48 sequences (24 per rank on 2 ranks)
  for (int world : {1, 2}) {
    std::string tag = std::to_string(world);
    run(world, {train, "sft", "--checkpoint", w + "/init", "--out", w + "/sft" + tag, "--task",
                "reverse", "--steps", "3", "--batch-size", "48", "--micro-batch", "16", "--lr",
                "3e-3", "--metrics", w + "/sft" + tag + ".jsonl"});
  }
  std::vector<double> l1 = losses(w + "/sft1.jsonl"), l2 = losses(w + "/sft2.jsonl");
  ASSERT_EQ(l1.size(), 3u);
  ASSERT_EQ(l2.size(), 3u);
  for (size_t i = 0; i < l1.size(); i++) EXPECT_NEAR(l1[i], l2[i], 1e-5 * std::fabs(l1[i])) << "step " << i;
  double d_sft = max_weight_diff(w + "/sft1", w + "/sft2");
  std::printf("sft: losses %.7f %.7f %.7f vs %.7f %.7f %.7f, max weight diff %.3e\n", l1[0], l1[1],
              l1[2], l2[0], l2[1], l2[2], d_sft);
  EXPECT_LT(d_sft, 1e-4);

  // GRPO: one rollout set, scored by the built-in verifier, trained on 1 and on 2 ranks
  run(1, {gen, "--checkpoint", w + "/sft1", "--task", "reverse", "--num-prompts", "12", "--samples",
          "4", "--chunk-size", "12", "--out-dir", w + "/rollouts", "--max-new-tokens", "10"});
  run(1, {reward, "--rollouts", w + "/rollouts/chunk-0.jsonl", "--out", w + "/rewards.jsonl"});
  // rewards of an early policy are mostly 0: replace them by a fixed pattern so that every
  // group has signal and the advantages are non-trivial
  {
    std::ifstream in(w + "/rewards.jsonl");
    std::ofstream out(w + "/rewards-pattern.jsonl");
    std::string line;
    for (int n = 0; std::getline(in, line); n++) {
      io::Json j = io::parse_json(line, "rewards");
      out << "{\"prompt_id\":" << io::integer_field(j, "prompt_id", "r")
          << ",\"sample_index\":" << io::integer_field(j, "sample_index", "r")
          << ",\"reward\":" << ((n * 7) % 3 == 0 ? 1 : 0) << "}\n";
    }
  }
  for (int world : {1, 2}) {
    std::string tag = std::to_string(world);
    run(world, {train, "grpo", "--checkpoint", w + "/sft1", "--out", w + "/grpo" + tag, "--rollouts",
                w + "/rollouts/chunk-0.jsonl", "--rewards", w + "/rewards-pattern.jsonl",
                "--ref-checkpoint", w + "/init", "--kl-coef", "0.05", "--entropy-coef", "0.01",
                "--minibatches", "2", "--micro-batch", "8", "--metrics", w + "/grpo" + tag + ".jsonl"});
  }
  l1 = losses(w + "/grpo1.jsonl");
  l2 = losses(w + "/grpo2.jsonl");
  ASSERT_EQ(l1.size(), 2u);
  ASSERT_EQ(l2.size(), 2u);
  for (size_t i = 0; i < l1.size(); i++) EXPECT_NEAR(l1[i], l2[i], 1e-5 + 1e-5 * std::fabs(l1[i])) << "step " << i;
  double d_grpo = max_weight_diff(w + "/grpo1", w + "/grpo2");
  std::printf("grpo: losses %.7f %.7f vs %.7f %.7f, max weight diff %.3e\n", l1[0], l1[1], l2[0],
              l2[1], d_grpo);
  EXPECT_LT(d_grpo, 1e-4);
  fs::remove_all(w);
}

TEST(MoeTools, ResumedGenerationIsByteIdenticalAndBadInputExitsTwo) {
  const std::string w = work_dir() + "-gen";
  const std::string train = MOERL_MOE_TRAIN, gen = MOERL_MOE_GENERATE;
  run(1, {train, "init", "--out", w + "/init", "--seed", "9", "--dim", "32", "--heads", "2",
          "--experts", "4", "--expert-dim", "32"});
  // Some sampling noise: a fresh init samples nearly uniform tokens at temperature 1.
  std::vector<std::string> base = {gen, "--checkpoint", w + "/init", "--task", "sort",
                                    "--num-prompts", "10", "--samples", "3", "--chunk-size", "4",
                                    "--seed", "77", "--iteration", "2", "--top-p", "0.95"};
  std::vector<std::string> full = base, resumed = base;
  full.insert(full.end(), {"--out-dir", w + "/full"});
  resumed.insert(resumed.end(), {"--out-dir", w + "/resumed", "--start-chunk", "1"});
  run(1, full);
  run(1, resumed);
  EXPECT_FALSE(fs::exists(w + "/resumed/chunk-0.jsonl"));
  for (int k : {1, 2}) {
    std::string name = "/chunk-" + std::to_string(k) + ".jsonl";
    std::string a = io::read_file(w + "/full" + name), b = io::read_file(w + "/resumed" + name);
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a, b) << name;
  }
  // chunk 2 holds the last 2 prompts (ids 8, 9), 3 samples each
  std::string last = io::read_file(w + "/full/chunk-2.jsonl");
  EXPECT_EQ(std::count(last.begin(), last.end(), '\n'), 6);

  // a prompts file: samples are seeded by prompt id, not by position in the file
  {
    std::ofstream(w + "/a.jsonl") << "{\"prompt_id\":5,\"prompt\":\"rev:abc=\"}\n";
    std::ofstream(w + "/b.jsonl") << "{\"prompt_id\":9,\"prompt\":\"sort:12=\"}\n"
                                  << "{\"prompt_id\":5,\"prompt\":\"rev:abc=\"}\n";
    std::vector<std::string> common = {gen, "--checkpoint", w + "/init", "--task", "dataset",
                                       "--samples", "2", "--seed", "3", "--top-p", "0.95"};
    std::vector<std::string> ga = common, gb = common;
    ga.insert(ga.end(), {"--prompts", w + "/a.jsonl", "--num-prompts", "1", "--out-dir", w + "/pa"});
    gb.insert(gb.end(), {"--prompts", w + "/b.jsonl", "--first-prompt", "1", "--num-prompts", "1",
                         "--out-dir", w + "/pb"});
    run(1, ga);
    run(1, gb);
    std::string a = io::read_file(w + "/pa/chunk-0.jsonl"), b = io::read_file(w + "/pb/chunk-0.jsonl");
    EXPECT_NE(a.find("\"prompt_id\":5"), std::string::npos);
    EXPECT_NE(a.find("\"task\":\"dataset\""), std::string::npos);
    EXPECT_EQ(a, b);
  }

  // bad input -> exit 2 (do not retry): unknown flag, unknown task, uncommitted checkpoint
  auto exit_code = [](const std::vector<std::string>& args) {
    return run_ranks(1, "shm", 30, args, 60)[0].exit_code;
  };
  EXPECT_EQ(exit_code({gen, "--checkpoint", w + "/init", "--task", "sort", "--out-dir", w + "/x",
                       "--bogus", "1"}), 2);
  EXPECT_EQ(exit_code({gen, "--checkpoint", w + "/init", "--task", "nope", "--out-dir", w + "/x"}), 2);
  fs::remove(w + "/init/manifest.json");
  EXPECT_EQ(exit_code({train, "sft", "--checkpoint", w + "/init", "--out", w + "/y", "--task", "sort"}), 2);
  fs::remove_all(w);
}

}  // namespace
}  // namespace moerl
