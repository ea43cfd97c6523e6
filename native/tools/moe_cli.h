// Shared by the moe_* tools: --flag value parsing with typed getters, the exit-code
// mapping of the rank contract (0 done, 2 bad input, 1 anything else = retryable) and the
// rollout JSONL record.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace moerl::tools {

class Args {
 public:
  // argv[first..]: "--name value" pairs, "--name" alone for booleans listed in `switches`.
  Args(int argc, char** argv, int first, const std::set<std::string>& switches = {});
  std::string str(const std::string& name, const std::string& fallback) const;
  std::string required(const std::string& name) const;
  std::vector<std::string> list(const std::string& name) const;  // comma-separated
  int64_t integer(const std::string& name, int64_t fallback) const;
  double number(const std::string& name, double fallback) const;
  bool flag(const std::string& name) const;
  // Throws BadInput naming the first flag that no getter asked for (a typo).
  void check_all_used() const;

 private:
  std::map<std::string, std::string> values_;
  mutable std::set<std::string> used_;
};

// Runs body, maps moerl::Error kinds and other exceptions to exit codes, prints the error.
int run_tool(const char* name, const std::function<int()>& body);

// One generated sample: a line of a rollout chunk file.
struct RolloutRecord {
  int64_t prompt_id = 0;
  int64_t sample_index = 0;
  int64_t iteration = 0;
  std::string task;
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs;
  std::string finish_reason;  // "stop" | "length"
};

std::string rollout_to_json(const RolloutRecord& r);
// Reads every line of every file; throws BadInput naming file and line on a bad record.
std::vector<RolloutRecord> read_rollouts(const std::vector<std::string>& paths);

}  // namespace moerl::tools
