// The tools' command lines, run as separate processes: --help of every tool exits 0 and
// lists its options; bad flags exit 2 naming the flag; list files (--rollouts-file,
// --rewards-file) give exactly what the comma forms give; progress lines; a chunk
// generated twice by two processes is byte-identical; SFT examples as token ids train exactly
// as the same examples as text; a tool runs OpenBLAS's AVX2 kernels on any CPU that has them,
// unless OPENBLAS_CORETYPE says otherwise.
#include <gtest/gtest.h>
#include <sys/wait.h>  // WEXITSTATUS
#include <unistd.h>    // getpid

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/json.h"
#include "model/kernels.h"  // blas_core_uses_avx2
#include "tasks/tokenizer.h"  // the text examples as the ids moe_train makes of them

namespace moerl {
namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  std::vector<io::Json> json_lines() const {  // stdout lines that are JSON objects
    std::vector<io::Json> out;
    std::istringstream is(output);
    for (std::string line; std::getline(is, line);)
      if (!line.empty() && line[0] == '{') out.push_back(io::parse_json(line, "tool output"));
    return out;
  }
};

// Runs argv through the shell (arguments single-quoted) with stderr merged into stdout.
Result run(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const std::string& a : argv) {
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += q + "' ";
  }
  FILE* p = ::popen((cmd + "2>&1").c_str(), "r");
  Result r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kTrain = MOERL_MOE_TRAIN, kGenerate = MOERL_MOE_GENERATE,
                  kReward = MOERL_MOE_REWARD, kEpBench = MOERL_EP_BENCH;

TEST(ToolsHelp, EveryToolAndCommandExitsZeroListingItsOptions) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{kTrain, "--help"}, {"init", "sft", "grpo", "sgemm", "sha256"}},
      {{kTrain, "init", "--help"}, {"--out", "--experts", "--max-seq-len"}},
      {{kTrain, "sft", "--help"}, {"--checkpoint", "--task", "--data", "--steps", "--lr"}},
      {{kTrain, "grpo", "--help"}, {"--rollouts-file", "--rewards-file", "--rollouts", "--kl-coef"}},
      {{kTrain, "sgemm", "--help"}, {"--size", "--repeats"}},
      {{kTrain, "sha256", "--help"}, {"--file", "--repeats"}},
      {{kGenerate, "--help"}, {"--checkpoint", "--out-dir", "--max-new-tokens", "--no-kv-cache"}},
      {{kReward, "--help"}, {"--rollouts", "--rollouts-file", "--out"}},
      {{kEpBench, "--help"}, {"--experts"}},
  };
  for (const auto& [argv, options] : cases) {
    Result r = run(argv);
    EXPECT_EQ(r.exit_code, 0) << argv[0] << " " << argv[1] << ":\n" << r.output;
    for (const std::string& o : options)
      EXPECT_NE(r.output.find(o), std::string::npos) << argv[0] << " " << argv[1] << " lacks " << o;
  }
}

// OpenBLAS 0.3.21 falls back to its SSE3 kernels ("Prescott") on a CPU model it does not know;
// the tools then run themselves again with OPENBLAS_CORETYPE set (model::blas_core_to_set).
TEST(ToolsBlas, ToolsRunOpenBlasAvx2KernelsWhereTheCpuHasThemUnlessTold) {
  auto core = [](const std::vector<std::string>& env) {
    std::vector<std::string> argv = {"env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {kTrain, "sgemm", "--size", "64", "--repeats", "1"});
    const Result r = run(argv);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::vector<io::Json> lines = r.json_lines();
    return lines.empty() ? std::string() : io::string_field(lines.back(), "blas_core", "sgemm");
  };
  const std::string chosen = core({"-u", "OPENBLAS_CORETYPE"});
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    EXPECT_TRUE(model::blas_core_uses_avx2(chosen.c_str()))
        << "OpenBLAS runs " << chosen << " on a CPU with AVX2";
#endif
  EXPECT_FALSE(chosen.empty());
  EXPECT_EQ(core({"OPENBLAS_CORETYPE=Prescott"}), "Prescott");
}

TEST(ToolsHelp, BadFlagsExitTwoNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{kGenerate, "--checkpoint", "c", "--task", "sort", "--out-dir", "o", "--bogus", "1"}, "--bogus"},
      {{kGenerate, "--checkpoint", "c", "--task", "sort", "--out-dir", "o", "--samples", "x"}, "--samples"},
      {{kGenerate, "--checkpoint", "c", "--task", "sort", "--out-dir", "o", "--samples", "0"}, "--samples"},
      {{kGenerate, "--task", "sort", "--out-dir", "o"}, "--checkpoint"},
      {{kTrain, "sft", "--checkpoint", "c", "--out", "o", "--steps", "1.5"}, "--steps"},
      {{kTrain, "grpo", "--checkpoint", "c", "--out", "o", "--rollouts", "a", "--rollouts-file", "b"},
       "--rollouts"},
      {{kTrain, "nope"}, "nope"},
      {{kReward, "--rollouts"}, "--rollouts"},
  };
  for (const auto& [argv, flag] : cases) {
    Result r = run(argv);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(flag), std::string::npos) << r.output;
  }
}

// A config beyond a bound is bad input (exit 2) named before anything is allocated: a random
// init of ~1.3e13 parameters failed with std::bad_alloc (exit 1, retried), and a vocab_size of
// 2^32 + 32 in an HF config.json was imported as 32.
TEST(ToolsBadConfig, AConfigBeyondItsBoundsExitsTwoNamingFieldAndBound) {
  const std::string w = ::testing::TempDir() + "moerl-tools-bad-config-" + std::to_string(::getpid());
  fs::remove_all(w);
  fs::create_directories(w + "/hf");
  Result absurd = run({kTrain, "init", "--out", w + "/init", "--dim", "64", "--layers", "16",
                       "--experts", "16384", "--expert-dim", "262144"});
  EXPECT_EQ(absurd.exit_code, 2) << absurd.output;
  EXPECT_NE(absurd.output.find("config: the parameter count = "), std::string::npos) << absurd.output;
  EXPECT_NE(absurd.output.find("exceeds the bound 1099511627776 (kMaxParams in "
                               "native/model/config.h; a build with it raised allows more)"),
            std::string::npos)
      << absurd.output;
  std::ofstream(w + "/hf/config.json")
      << R"({"model_type":"qwen3_moe","vocab_size":4294967328,"hidden_size":16,)"
      << R"("num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":8,)"
      << R"("num_experts_per_tok":1,"num_experts":2,"moe_intermediate_size":8,)"
      << R"("rms_norm_eps":1e-6,"max_position_embeddings":64})";
  Result wide = run({kTrain, "init", "--out", w + "/init", "--from-hf", w + "/hf"});
  EXPECT_EQ(wide.exit_code, 2) << wide.output;
  EXPECT_NE(wide.output.find("field vocab_size: integer 4294967328 does not fit a 32-bit int"),
            std::string::npos)
      << wide.output;
  fs::remove_all(w);
}

struct ToolsTest : ::testing::Test {
  std::string w = ::testing::TempDir() + "moerl-tools-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  void SetUp() override {
    fs::remove_all(w);
    fs::create_directories(w);
    Result r = run({kTrain, "init", "--out", w + "/init", "--seed", "9", "--dim", "32", "--heads",
                    "2", "--experts", "4", "--expert-dim", "32"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  void TearDown() override { fs::remove_all(w); }
  std::vector<std::string> generate(const std::string& out_dir) const {
    return {kGenerate, "--checkpoint", w + "/init", "--task", "reverse", "--num-prompts", "6",
            "--samples", "3", "--chunk-size", "3", "--seed", "5", "--top-p", "0.95",
            "--out-dir", out_dir};
  }
};

TEST_F(ToolsTest, GenerationInTwoProcessesIsByteIdentical) {
  ASSERT_EQ(run(generate(w + "/a")).exit_code, 0);
  ASSERT_EQ(run(generate(w + "/b")).exit_code, 0);
  for (const char* name : {"/chunk-0.jsonl", "/chunk-1.jsonl"}) {
    std::string a = io::read_file(w + "/a" + name);
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a, io::read_file(w + "/b" + name)) << name;
  }
}

TEST_F(ToolsTest, GenerateReportsProgressWithinAChunk) {
  std::vector<std::string> argv = generate(w + "/p");
  argv.insert(argv.end(), {"--progress-interval", "0", "--max-new-tokens", "5"});
  Result r = run(argv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int64_t chunk = 0, last_step = 0, last_tokens = 0, progress_lines = 0;
  for (const io::Json& j : r.json_lines()) {
    if (j.contains("progress")) {
      EXPECT_EQ(io::integer_field(j, "chunk", "p"), chunk) << j.dump();
      EXPECT_EQ(io::integer_field(j, "steps", "p"), 5);
      int64_t step = io::integer_field(j, "step", "p"), tokens = io::integer_field(j, "tokens", "p");
      EXPECT_GE(step, last_step);
      EXPECT_LE(step, 5);
      EXPECT_GE(tokens, last_tokens);
      last_step = step;
      last_tokens = tokens;
      progress_lines++;
    } else if (j.contains("chunk")) {  // a chunk's done line: its tokens are the last progress'
      EXPECT_EQ(io::integer_field(j, "chunk", "d"), chunk);
      EXPECT_EQ(io::integer_field(j, "new_tokens", "d"), last_tokens);
      chunk++;
      last_step = last_tokens = 0;
    }
  }
  EXPECT_EQ(chunk, 2);
  EXPECT_GT(progress_lines, 2);
}

TEST_F(ToolsTest, ListFilesGiveWhatCommaListsGive) {
  ASSERT_EQ(run(generate(w + "/r")).exit_code, 0);
  const std::string c0 = w + "/r/chunk-0.jsonl", c1 = w + "/r/chunk-1.jsonl";
  std::ofstream(w + "/rollouts.txt") << c0 << "\n\n" << c1 << "\r\n";  // a blank line, CRLF
  Result comma = run({kReward, "--rollouts", c0 + "," + c1, "--out", w + "/rewards.jsonl"});
  Result listed = run({kReward, "--rollouts-file", w + "/rollouts.txt", "--out", w + "/rewards2.jsonl"});
  ASSERT_EQ(comma.exit_code, 0) << comma.output;
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_EQ(comma.output, listed.output);
  EXPECT_EQ(io::read_file(w + "/rewards.jsonl"), io::read_file(w + "/rewards2.jsonl"));

  // rewards of a fresh policy are all 0: a fixed pattern, split over two files, gives the
  // groups a signal
  {
    std::ofstream a(w + "/rewards-a.jsonl"), b(w + "/rewards-b.jsonl");
    int n = 0;
    io::for_each_json_line(w + "/rewards.jsonl", [&](const io::Json& j, const std::string& what) {
      (n % 2 == 0 ? a : b) << "{\"prompt_id\":" << io::integer_field(j, "prompt_id", what)
                           << ",\"sample_index\":" << io::integer_field(j, "sample_index", what)
                           << ",\"reward\":" << (n % 3 == 0 ? 1 : 0) << "}\n";
      n++;
    });
  }
  std::ofstream(w + "/rewards.txt") << w + "/rewards-a.jsonl\n" << w + "/rewards-b.jsonl\n";
  auto grpo = [&](const std::string& out, const std::vector<std::string>& inputs) {
    std::vector<std::string> argv = {kTrain, "grpo", "--checkpoint", w + "/init", "--out", out,
                                     "--minibatches", "2", "--progress-interval", "0"};
    argv.insert(argv.end(), inputs.begin(), inputs.end());
    return run(argv);
  };
  Result g1 = grpo(w + "/g1", {"--rollouts", c0 + "," + c1, "--rewards",
                               w + "/rewards-a.jsonl," + w + "/rewards-b.jsonl"});
  Result g2 = grpo(w + "/g2", {"--rollouts-file", w + "/rollouts.txt", "--rewards-file", w + "/rewards.txt"});
  ASSERT_EQ(g1.exit_code, 0) << g1.output;
  ASSERT_EQ(g2.exit_code, 0) << g2.output;
  for (const char* name : {"/manifest.json", "/dense.safetensors", "/experts-rank0.safetensors"})
    EXPECT_EQ(io::read_file(w + "/g1" + name), io::read_file(w + "/g2" + name)) << name;
  std::set<std::string> phases;
  for (const io::Json& j : g2.json_lines())
    if (j.contains("progress")) phases.insert(io::string_field(j, "phase", "progress"));
  EXPECT_EQ(phases, (std::set<std::string>{"read_rollouts", "grpo"}));

  // a list entry that cannot be opened: exit 2 naming the list file and line
  std::ofstream(w + "/bad.txt") << c0 << "\n" << w + "/missing.jsonl\n";
  Result bad = run({kReward, "--rollouts-file", w + "/bad.txt"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find(w + "/bad.txt line 2: cannot open " + w + "/missing.jsonl"),
            std::string::npos) << bad.output;
  std::ofstream(w + "/empty.txt") << "\n  \n";
  Result empty = run({kReward, "--rollouts-file", w + "/empty.txt"});
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_NE(empty.output.find("lists no files"), std::string::npos) << empty.output;
}

TEST_F(ToolsTest, MalformedJsonInputExitsTwoNamingFileAndLine) {
  ASSERT_EQ(run(generate(w + "/r")).exit_code, 0);
  std::string good = io::read_file(w + "/r/chunk-0.jsonl");
  std::ofstream(w + "/bad.jsonl") << good.substr(0, good.find('\n') + 1) << "{\"prompt_id\":1-2}\n";
  Result r = run({kReward, "--rollouts", w + "/bad.jsonl"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(w + "/bad.jsonl line 2: invalid JSON"), std::string::npos) << r.output;
}

// A rollout's "loss_mask" (an episode's environment tokens) reaches the GRPO loss: all ones
// trains exactly as no mask, a mask with zeros trains differently, a bad one exits 2 naming the
// file and line.
TEST_F(ToolsTest, GrpoTakesTheRolloutsLossMask) {
  ASSERT_EQ(run(generate(w + "/r")).exit_code, 0);
  const std::string chunk = w + "/r/chunk-0.jsonl";
  auto with_mask = [&](const std::string& path, const std::function<int(size_t, size_t)>& bit) {
    std::ofstream out(path);
    io::for_each_json_line(chunk, [&](const io::Json& j, const std::string&) {
      io::Json line = j;
      io::Json mask = io::Json::array();
      for (size_t k = 0; k < j["tokens"].size(); k++) mask.push_back(bit(k, j["tokens"].size()));
      line["loss_mask"] = mask;
      out << line.dump() << "\n";
    });
  };
  with_mask(w + "/ones.jsonl", [](size_t, size_t) { return 1; });
  with_mask(w + "/half.jsonl", [](size_t k, size_t) { return (int)(k % 2); });
  with_mask(w + "/short.jsonl", [](size_t k, size_t n) { return k + 1 < n ? 1 : 2; });
  {
    std::ofstream rewards(w + "/rewards.jsonl");
    int n = 0;
    io::for_each_json_line(chunk, [&](const io::Json& j, const std::string& what) {
      rewards << "{\"prompt_id\":" << io::integer_field(j, "prompt_id", what)
              << ",\"sample_index\":" << io::integer_field(j, "sample_index", what)
              << ",\"reward\":" << (n++ % 3 == 0 ? 1 : 0) << "}\n";
    });
  }
  auto grpo = [&](const std::string& rollouts, const std::string& out) {
    return run({kTrain, "grpo", "--checkpoint", w + "/init", "--out", out, "--rollouts", rollouts,
                "--rewards", w + "/rewards.jsonl", "--progress-interval", "0"});
  };
  for (const char* name : {"plain", "ones", "half"}) {
    const std::string rollouts = std::string(name) == "plain" ? chunk : w + "/" + name + ".jsonl";
    Result r = grpo(rollouts, w + "/g-" + name);
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
  }
  const std::string weights = "/dense.safetensors";
  EXPECT_EQ(io::read_file(w + "/g-ones" + weights), io::read_file(w + "/g-plain" + weights));
  EXPECT_NE(io::read_file(w + "/g-half" + weights), io::read_file(w + "/g-plain" + weights));
  Result bad = grpo(w + "/short.jsonl", w + "/g-bad");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find(w + "/short.jsonl line 1 loss_mask: entry "), std::string::npos)
      << bad.output;
  EXPECT_NE(bad.output.find("is 2; each entry is 0"), std::string::npos) << bad.output;
}

TEST_F(ToolsTest, SftOnTokenIdsTrainsAsOnTheSameText) {
  const std::vector<std::pair<std::string, std::string>> examples = {
      {"12+30=", "42"}, {"reverse abc:", "cba"}, {"7+8=", "15"}};
  {
    std::ofstream text(w + "/text.jsonl"), ids(w + "/ids.jsonl");
    auto ids_json = [](const std::vector<int32_t>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
      return s + "]";
    };
    for (const auto& [prompt, answer] : examples) {
      text << "{\"prompt\":\"" << prompt << "\",\"answer\":\"" << answer << "\"}\n";
      std::vector<int32_t> completion = tasks::encode(answer);
      completion.push_back(tasks::kEos);  // learned as given: the eos is the file's to give
      ids << "{\"prompt_tokens\":" << ids_json(tasks::encode(prompt))
          << ",\"tokens\":" << ids_json(completion) << "}\n";
    }
  }
  auto sft = [&](const std::string& data, const std::string& out) {
    return run({kTrain, "sft", "--checkpoint", w + "/init", "--out", out, "--data", data,
                "--steps", "6", "--batch-size", "4", "--warmup-steps", "0", "--metrics",
                out + "-metrics.jsonl"});
  };
  Result a = sft(w + "/text.jsonl", w + "/text"), b = sft(w + "/ids.jsonl", w + "/ids");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  for (const char* name : {"/dense.safetensors", "/experts-rank0.safetensors"})
    EXPECT_EQ(io::read_file(w + "/text" + name), io::read_file(w + "/ids" + name)) << name;
  std::vector<double> loss;
  io::for_each_json_line(w + "/ids-metrics.jsonl", [&](const io::Json& j, const std::string& what) {
    loss.push_back(io::number_field(j, "loss", what));
  });
  ASSERT_EQ(loss.size(), 6u);
  EXPECT_LT(loss.back(), loss.front());

  // bad lines: exit 2 naming the file, line and field
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"prompt_tokens\":[2,3],\"tokens\":[4,48]}", "line 1 tokens: token id 48 outside the vocabulary of 48"},
      {"{\"prompt_tokens\":[2,3],\"tokens\":[]}", "line 1 tokens: empty"},
      {"{\"prompt_tokens\":[2,-1],\"tokens\":[4]}", "line 1 prompt_tokens: token id -1"},
      {"{\"prompt_tokens\":[2,3]}", "line 1"},
  };
  for (const auto& [line, message] : bad) {
    std::ofstream(w + "/bad.jsonl") << line << "\n";
    Result r = sft(w + "/bad.jsonl", w + "/bad");
    EXPECT_EQ(r.exit_code, 2) << line << ": " << r.output;
    EXPECT_NE(r.output.find(w + "/bad.jsonl " + message), std::string::npos) << line << ": " << r.output;
  }
}

}  // namespace
}  // namespace moerl
