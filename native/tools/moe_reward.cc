// moe_reward: the built-in exact-match verifier, for running the loop without the
// orchestrator (the campaign's TypeScript verifiers implement docs/tasks.md themselves).
//
//   moe_reward (--rollouts F1,F2 | --rollouts-file LIST) [--out rewards.jsonl]
//
// LIST: a text file with one rollout file path per line (blank lines ignored). Writes one
// line per sample {"prompt_id":p,"sample_index":s,"reward":r} and prints
// {"samples":n,"mean_reward":m,"accuracy":a} where accuracy is the fraction of rewards 1.
// Exit 0 done (or --help), 2 bad input, 1 anything else.
#include <algorithm>  // std::max
#include <cstdio>     // std::printf
#include <sstream>    // std::ostringstream

#include "common/check.h"
#include "io/json.h"
#include "tasks/tasks.h"
#include "tools/moe_cli.h"

namespace moerl::tools {
namespace {

struct Options {
  PathList rollouts;
  std::string out;
};

int run(const Options& o) {
  std::vector<RolloutRecord> rollouts = read_rollouts(o.rollouts.paths());
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
  if (!o.out.empty()) io::write_file_atomic(o.out, os.str());
  double n = std::max<double>(1.0, (double)rollouts.size());
  std::printf("{\"samples\":%zu,\"mean_reward\":%.6f,\"accuracy\":%.6f}\n", rollouts.size(), sum / n,
              correct / n);
  return 0;
}

}  // namespace
}  // namespace moerl::tools

int main(int argc, char** argv) {
  using namespace moerl::tools;
  CLI::App app{"Scores rollout files with the built-in exact-match verifiers (docs/tasks.md).",
               "moe_reward"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  Options o;
  add_path_list(&app, "rollouts", "rollout JSONL", o.rollouts);
  app.add_option("--out", o.out, "rewards JSONL to write (one line per sample)");
  return run_tool(app, argc, argv, [&] { return run(o); });
}
