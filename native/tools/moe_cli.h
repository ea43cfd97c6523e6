// Shared by the moe_* tools: running a tool under the rank contract's exit codes, input path
// lists, throttled progress lines and the rollout JSONL record. Flags are parsed by CLI11,
// so every tool has a --help that lists its options.
#pragma once

#include <CLI/CLI.hpp>  // CLI::App: typed options, validators, --help

#include <chrono>  // steady_clock for Progress
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/json.h"
#include "model/expert_comm.h"
#include "rl/advantages.h"
#include "rl/trainer.h"
#include "transport/communicator.h"

namespace moerl::tools {

// The exit code of a rank that stops because another rank of its job was lost (a
// moerl::Error of kind PeerFailure: a peer died, failed, or a replacement broke the
// rendezvous). Not this rank's fault: the launcher restarts the whole job without counting
// it (Kubernetes: the podFailurePolicy ignores it). EX_TEMPFAIL of sysexits.h.
constexpr int kPeerLostExitCode = 75;

// Parses argv into app (whose options are bound to variables), then runs body. Exit codes:
// 0 done or --help; 2 bad input: an unknown flag, a missing or malformed value (CLI11's
// message names the flag) or a moerl::Error of kind BadInput; kPeerLostExitCode (75) a peer
// was lost (PeerFailure); 1 anything else (retryable: this rank's own failure), std::bad_alloc
// included: a config beyond model/config.h's bounds is bad input before anything is allocated,
// one within them that does not fit this machine's memory is a resource failure.
int run_tool(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

// OpenBLAS reads OPENBLAS_CORETYPE once, as it loads: a process whose OpenBLAS fell back to
// kernels slower than the CPU runs (model::blas_core_to_set) runs itself again with it set, so
// every tool on such a host gets the same, faster kernels (and so the same bits), and so do
// the processes it starts. Returns only when nothing is to change or the exec failed (then with
// OpenBLAS's own choice). run_tool calls it first; a tool with its own main calls it first too.
void run_with_cpu_blas_kernels(char** argv);

// For the commands that run the model (sft, grpo, generate, score): freed memory stays in the
// process for the next allocation instead of going back to the kernel. A forward and backward
// free and allocate buffers of the same sizes layer after layer; each fresh mapping costs a page
// fault and a zeroed page per 4 KiB (a GRPO step of bench/hf_engines' model: 1.6 M faults and
// 5 s of system time per process, 0.7 M and 2.5 s with this; peak RSS +17%). Not for init or
// export, whose peak RSS is bounded (docs/benchmarks.md).
void keep_freed_memory();

// This process's rank of a job (the rank contract's env) and its door to the EP core.
struct Rank {
  transport::Communicator comm;
  model::ExpertComm ep;
  Rank(const transport::Config& c, int num_experts) : comm(c), ep(comm, num_experts) {}
};

// The rank program's descriptor for wait_until_stored (workers/rank.ts sets it for a job's
// last step): a line "written" goes out on it, a line "stored" comes back.
constexpr const char* kStoredFdEnv = "MOERL_STORED_FD";

// The end of a command that wrote this rank's outputs: under the rank program
// (MOERL_STORED_FD set), the group does not break up before every rank's outputs are in the
// store. Says "written", waits for "stored" (the rank program has uploaded them), then waits
// at a barrier for every rank, up to MOERL_STARTUP_TIMEOUT_S (uploads can take minutes). A
// rank lost before every rank got there stops the others with PeerFailure (exit 75) and the
// job restarts as a gang; so no rank exits 0 while another's outputs may still be missing,
// and a job's first rank to succeed means that every rank has stored its outputs. Why: a
// Kubernetes Indexed Job never runs an index that succeeded again, so a rank lost after its
// peers had succeeded would be replaced alone, and a lone rank never meets its group again.
// The descriptor closed before "stored" means the rank program could not store them: an
// error (exit 1). Returns at once without MOERL_STORED_FD (a run by hand).
void wait_until_stored(Rank& rank);

// Value checks for numeric flags: "must be > 0" / ">= 0" naming the flag (CLI11's Range
// would print DBL_MAX in full). A value that is no number is left to CLI11's conversion error.
extern const CLI::Validator kPositive;
extern const CLI::Validator kNonNegative;

// The policy loss flags of moe_train grpo and moe_hf score (docs/algorithms.md): --policy-loss
// ppo-clip|gspo|cispo, --aggregation (verl's loss_agg_mode names), --kl-estimator k1|k2|k3,
// --clip-eps (below) and --clip-high (above; default: --clip-eps), --norm-tokens.
void add_policy_loss_options(CLI::App* cmd, rl::LossConfig& lc);
// --advantage group-norm|group-mean|rloo|reinforce-pp-baseline.
void add_advantage_option(CLI::App* cmd, rl::AdvantageEstimator& estimator);

// Input files given either as --<name> F1,F2 (comma-separated) or as --<name>-file LIST (a
// text file, one path per line, blank lines ignored), for lists longer than the 128 KiB
// Linux allows in one argument.
struct PathList {
  std::string name;       // flag name without dashes, e.g. "rollouts"
  std::string comma;      // --<name>
  std::string list_file;  // --<name>-file
  // The paths, in order. BadInput unless exactly one form was given, if a list holds no path,
  // or if a path cannot be opened (naming the list file and line when it came from one).
  std::vector<std::string> paths() const;
};
// Adds --<name> and --<name>-file to app; `what` describes the files (e.g. "rollout JSONL").
void add_path_list(CLI::App* app, const std::string& name, const std::string& what, PathList& out);

// Prints lines to stdout at most once per interval, the first one interval after
// construction: progress during a long phase, for the activities' heartbeats.
class Progress {
 public:
  explicit Progress(double interval_s = 1.0);
  // Prints line() (built only when due) and flushes.
  void maybe_print(const std::function<std::string()>& line);

 private:
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_;
};

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
  // [tokens] 1 = the policy's token (trained), 0 = an environment's (an episode's tool result);
  // empty (no "loss_mask" key) = all the policy's: a one-shot completion.
  std::vector<uint8_t> loss_mask;
};

// The optional "loss_mask" of a JSON line: 0/1 per completion token, `completion` of them;
// empty when absent. Throws BadInput naming `what` on any other value or length.
std::vector<uint8_t> loss_mask_field(const io::Json& j, size_t completion, const std::string& what);

std::string rollout_to_json(const RolloutRecord& r);
// Reads every line of every file; throws BadInput naming file and line on a bad record.
std::vector<RolloutRecord> read_rollouts(const std::vector<std::string>& paths);

}  // namespace moerl::tools
