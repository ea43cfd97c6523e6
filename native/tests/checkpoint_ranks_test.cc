// Checkpoints of ranks with separate filesystems: moe_train on 2 ranks, each with its own
// --out (and --checkpoint) directory, must produce the files a shared directory gets (rank
// 1 holding its experts and their moments plus copies of the manifest and the dense files, all
// it needs to load), and a rank must load from a directory holding only what it needs.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "ep_spawn.h"
#include "io/json.h"

namespace moerl {
namespace {

namespace fs = std::filesystem;
using ep::testing::describe;
using ep::testing::run_ranks_each;

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Every file of each rank directory equals the shared directory's file of that name, and
// together they are all of the shared directory's files.
void expect_union_equals(const std::string& shared, const std::vector<std::string>& rank_dirs) {
  std::set<std::string> all;
  for (const std::string& d : rank_dirs) {
    for (const std::string& name : names_in(d)) {
      all.insert(name);
      EXPECT_EQ(io::read_file(d + "/" + name), io::read_file(shared + "/" + name)) << d << "/" << name;
    }
  }
  EXPECT_EQ(all, names_in(shared));
}

struct Ranks {
  std::vector<ep::testing::RankResult> results;
  bool ok() const {
    for (const auto& r : results)
      if (r.exit_code != 0) return false;
    return true;
  }
};

// args(r) for rank r of 2 ranks (shm).
Ranks run2(const std::function<std::vector<std::string>(int)>& args) {
  return {run_ranks_each(2, "shm", 30, args, 120)};
}

TEST(CheckpointRanks, RankLocalDirectoriesHoldTheSharedDirectoryCheckpoint) {
  const std::string w = ::testing::TempDir() + "moerl-ckpt-ranks-" + std::to_string(::getpid());
  fs::remove_all(w);
  const std::string train = MOERL_MOE_TRAIN;
  auto rank_dir = [&](const std::string& what, int r) { return w + "/" + what + "-rank" + std::to_string(r); };
  const std::vector<std::string> model = {"--seed", "4", "--dim", "32", "--heads", "2",
                                          "--experts", "4", "--expert-dim", "32"};
  auto init = [&](const std::string& out) {
    std::vector<std::string> a = {train, "init", "--out", out};
    a.insert(a.end(), model.begin(), model.end());
    return a;
  };
  Ranks r = run2([&](int) { return init(w + "/init-shared"); });
  ASSERT_TRUE(r.ok()) << describe(r.results);
  r = run2([&](int rank) { return init(rank_dir("init", rank)); });
  ASSERT_TRUE(r.ok()) << describe(r.results);
  EXPECT_EQ(names_in(rank_dir("init", 0)),
            (std::set<std::string>{"manifest.json", "dense.safetensors", "experts-rank0.safetensors"}));
  // rank 1's directory: exactly what rank 1 needs to load it (for a job's next step)
  EXPECT_EQ(names_in(rank_dir("init", 1)),
            (std::set<std::string>{"manifest.json", "dense.safetensors", "experts-rank1.safetensors"}));
  expect_union_equals(w + "/init-shared", {rank_dir("init", 0), rank_dir("init", 1)});

  // Each rank trains from its own directory; the result equals training from the shared one.
  auto sft = [&](const std::string& in, const std::string& out) {
    return std::vector<std::string>{train, "sft", "--checkpoint", in, "--out", out, "--task",
                                    "reverse", "--steps", "2", "--batch-size", "8"};
  };
  r = run2([&](int) { return sft(w + "/init-shared", w + "/sft-shared"); });
  ASSERT_TRUE(r.ok()) << describe(r.results);
  r = run2([&](int rank) { return sft(rank_dir("init", rank), rank_dir("sft", rank)); });
  ASSERT_TRUE(r.ok()) << describe(r.results);
  expect_union_equals(w + "/sft-shared", {rank_dir("sft", 0), rank_dir("sft", 1)});
  // After optimizer steps the moments are files of their own (init's fresh ones had none).
  EXPECT_EQ(names_in(rank_dir("sft", 1)),
            (std::set<std::string>{"manifest.json", "dense.safetensors", "experts-rank1.safetensors",
                                   "optimizer-dense.safetensors", "optimizer-experts-rank1.safetensors"}));

  // Training needs the moments of the rank's experts: without them, bad input naming the file.
  fs::remove(rank_dir("sft", 1) + "/optimizer-experts-rank1.safetensors");
  r = run2([&](int rank) { return sft(rank_dir("sft", rank), rank_dir("sft3", rank)); });
  EXPECT_EQ(r.results[1].exit_code, 2) << describe(r.results);
  EXPECT_NE(r.results[1].stderr_text.find("optimizer-experts-rank1.safetensors is missing"), std::string::npos)
      << r.results[1].stderr_text;

  // A rank directory without the experts file of the rank's own experts: bad input (exit 2)
  // naming the file.
  fs::remove(rank_dir("init", 1) + "/experts-rank1.safetensors");
  r = run2([&](int rank) { return sft(rank_dir("init", rank), rank_dir("sft2", rank)); });
  EXPECT_EQ(r.results[1].exit_code, 2) << describe(r.results);
  EXPECT_NE(r.results[1].stderr_text.find("experts-rank1.safetensors is missing"), std::string::npos)
      << r.results[1].stderr_text;
  EXPECT_NE(r.results[0].exit_code, 0) << "rank 0 must fail when its peer is gone";
  fs::remove_all(w);
}

}  // namespace
}  // namespace moerl
