// moe_reward: the built-in exact-match verifier, for running the loop without the
// orchestrator (the campaign's TypeScript verifiers implement docs/tasks.md themselves).
//
//   moe_reward --rollouts F1,F2 [--out rewards.jsonl]
//
// Writes one line per sample {"prompt_id":p,"sample_index":s,"reward":r} and prints
// {"samples":n,"mean_reward":m,"accuracy":a} where accuracy is the fraction of rewards 1.
#include <algorithm>  // std::max
#include <cstdio>   // std::printf
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/json.h"
#include "tasks/tasks.h"
#include "tools/moe_cli.h"

namespace moerl::tools {
namespace {

int run(const Args& a) {
  std::vector<std::string> files = a.list("rollouts");
  std::string out = a.str("out", "");
  a.check_all_used();
  MOERL_CHECK_INPUT(!files.empty(), "missing required flag --rollouts (comma-separated files)");
  std::vector<RolloutRecord> rollouts = read_rollouts(files);
  std::ostringstream os;
  double sum = 0.0;
  int64_t correct = 0;
  for (const RolloutRecord& r : rollouts) {
    float reward = tasks::reward(r.task, r.prompt, r.text, r.finish_reason == "stop");
    sum += reward;
    correct += reward == 1.0f;
    os << "{\"prompt_id\":" << r.prompt_id << ",\"sample_index\":" << r.sample_index
       << ",\"reward\":" << io::json_float(reward) << "}\n";
  }
  if (!out.empty()) io::write_file_atomic(out, os.str());
  double n = std::max<double>(1.0, (double)rollouts.size());
  std::printf("{\"samples\":%zu,\"mean_reward\":%.6f,\"accuracy\":%.6f}\n", rollouts.size(), sum / n,
              correct / n);
  return 0;
}

}  // namespace
}  // namespace moerl::tools

int main(int argc, char** argv) {
  using namespace moerl::tools;
  return run_tool("moe_reward", [&] { return run(Args(argc, argv, 1)); });
}
