// Exit codes, path lists, progress lines and rollout records for the moe_* tools.
#include "tools/moe_cli.h"

#include <malloc.h>  // mallopt
#include <unistd.h>  // read, write on the rank program's descriptor; execv

#include <cerrno>   // errno, EINTR
#include <climits>  // INT_MAX
#include <cstdio>   // std::fprintf
#include <cstdlib>  // std::strtod, std::getenv
#include <cstring>  // std::strerror
#include <filesystem>  // read_symlink
#include <fstream>  // std::ifstream
#include <new>      // std::bad_alloc
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/json.h"
#include "model/kernels.h"

namespace moerl::tools {

void run_with_cpu_blas_kernels(char** argv) {
  const char* core = model::blas_core_to_set();
  if (core == nullptr) return;
  // The binary's own path, not /proc/self/exe: the kernel names the process after the path it
  // execs (comm, what ps and pgrep show), and it must stay moe_train, not "exe".
  std::error_code error;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", error).string();
  if (error) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv(self.c_str(), argv);
  unsetenv("OPENBLAS_CORETYPE");
}

int run_tool(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  run_with_cpu_blas_kernels(argv);
  const std::string name = app.get_name();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is a ParseError with exit code 0: CLI11 prints the help of the (sub)command
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::fprintf(stderr, "%s: error: %s (see %s --help)\n", name.c_str(), e.what(), name.c_str());
    return 2;
  }
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    if (e.kind() == ErrorKind::BadInput) return 2;
    return e.kind() == ErrorKind::PeerFailure ? kPeerLostExitCode : 1;
  } catch (const std::bad_alloc&) {
    // a config within its bounds (model/config.h) that this machine cannot hold: a resource
    // failure, retryable where there is more memory, not bad input
    std::fprintf(stderr, "%s: error: out of memory (std::bad_alloc): the model, its optimizer "
                 "state or a batch does not fit this machine's memory\n", name.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return 1;
  }
}

void wait_until_stored(Rank& rank) {
  const char* text = std::getenv(kStoredFdEnv);
  if (text == nullptr || *text == '\0') return;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  MOERL_CHECK_INPUT(*end == '\0' && fd >= 3 && fd <= INT_MAX, kStoredFdEnv, "=", text,
                    " must be a file descriptor number (3 or more)");
  const int self = rank.comm.rank();
  const std::string written = "written\n";
  for (size_t sent = 0; sent < written.size();) {
    const ssize_t k = ::write(int(fd), written.data() + sent, written.size() - sent);
    if (k < 0 && errno == EINTR) continue;
    MOERL_CHECK(k > 0, "rank ", self, ": cannot tell the rank program that the outputs are "
                "written (", kStoredFdEnv, "=", fd, "): ", std::strerror(errno));
    sent += size_t(k);
  }
  std::string answer;
  for (char c = 0; c != '\n';) {
    const ssize_t k = ::read(int(fd), &c, 1);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      MOERL_FAIL(Internal, "rank ", self, ": the rank program did not store this rank's outputs "
                 "(", kStoredFdEnv, " closed", k < 0 ? std::string(": ") + std::strerror(errno) : "",
                 "); its log says why");
    if (c != '\n') answer += c;
  }
  MOERL_CHECK(answer == "stored", "rank ", self, ": the rank program answered \"", answer,
              "\" instead of \"stored\" on ", kStoredFdEnv);
  rank.comm.barrier(rank.comm.config().startup_timeout_s);
}

void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);              // large blocks from the heap too, so they are reused
  mallopt(M_TRIM_THRESHOLD, INT_MAX);  // and the heap never shrinks
}

namespace {

// A validator accepting numbers for which ok(x) holds (and every non-number, see above).
CLI::Validator number_check(bool (*ok)(double), const char* rule, const char* name) {
  return CLI::Validator(
      [ok, rule](std::string& value) -> std::string {
        char* end = nullptr;
        double x = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || ok(x)) return "";
        return std::string("must be ") + rule + ", got " + value;
      },
      name);
}

}  // namespace

const CLI::Validator kPositive = number_check([](double x) { return x > 0; }, "> 0", "POSITIVE");
const CLI::Validator kNonNegative = number_check([](double x) { return x >= 0; }, ">= 0", "NONNEGATIVE");

namespace {

// An option taking one of `names`, shown in --help and in its error as {a|b|c}.
template <typename Enum>
void add_choice(CLI::App* cmd, const std::string& flag, Enum& value,
                const std::vector<std::pair<std::string, Enum>>& names, const std::string& help) {
  std::string shown, fallback;
  for (const auto& [name, v] : names) {
    shown += (shown.empty() ? "" : "|") + name;
    if (v == value) fallback = name;
  }
  shown = "{" + shown + "}";
  cmd->add_option_function<std::string>(
         flag,
         [&value, names, flag, shown](const std::string& given) {
           for (const auto& [name, v] : names)
             if (name == given) {
               value = v;
               return;
             }
           throw CLI::ValidationError(flag, given + " is not one of " + shown);
         },
         help)
      ->type_name(shown)
      ->default_str(fallback);
}

}  // namespace

void add_policy_loss_options(CLI::App* cmd, rl::LossConfig& lc) {
  using rl::Aggregation, rl::KlEstimator, rl::PolicyLoss;
  add_choice<PolicyLoss>(cmd, "--policy-loss", lc.policy_loss,
                         {{"ppo-clip", PolicyLoss::PpoClip},
                          {"gspo", PolicyLoss::Gspo},
                          {"cispo", PolicyLoss::Cispo}},
                         "policy term of each token");
  add_choice<Aggregation>(cmd, "--aggregation", lc.aggregation,
                          {{"token-mean", Aggregation::TokenMean},
                           {"seq-mean-token-sum", Aggregation::SeqMeanTokenSum},
                           {"seq-mean-token-mean", Aggregation::SeqMeanTokenMean},
                           {"seq-mean-token-sum-norm", Aggregation::SeqMeanTokenSumNorm}},
                          "how token losses make the step's loss");
  add_choice<KlEstimator>(cmd, "--kl-estimator", lc.kl_estimator,
                          {{"k1", KlEstimator::K1}, {"k2", KlEstimator::K2}, {"k3", KlEstimator::K3}},
                          "estimator of the KL term");
  cmd->add_option("--clip-eps", lc.clip_eps, "ratio clip below, 1 - eps (and above without --clip-high)")
      ->check(kNonNegative);
  CLI::Option* high =
      cmd->add_option("--clip-high", lc.clip_high, "ratio clip above, 1 + eps [default: --clip-eps]")
          ->check(kNonNegative)
          ->default_str("");
  cmd->add_option("--norm-tokens", lc.norm_tokens, "seq-mean-token-sum-norm's constant token count")
      ->check(kNonNegative);
  cmd->parse_complete_callback([&lc, high] {
    if (high->count() == 0) lc.clip_high = lc.clip_eps;
    if (lc.aggregation == rl::Aggregation::SeqMeanTokenSumNorm && lc.norm_tokens <= 0)
      throw CLI::ValidationError("--aggregation", "seq-mean-token-sum-norm needs --norm-tokens > 0");
  });
}

void add_advantage_option(CLI::App* cmd, rl::AdvantageEstimator& estimator) {
  using rl::AdvantageEstimator;
  add_choice<AdvantageEstimator>(cmd, "--advantage", estimator,
                                 {{"group-norm", AdvantageEstimator::GroupNorm},
                                  {"group-mean", AdvantageEstimator::GroupMean},
                                  {"rloo", AdvantageEstimator::Rloo},
                                  {"reinforce-pp-baseline", AdvantageEstimator::ReinforcePpBaseline}},
                                 "advantage estimator of the rewards");
}

void add_path_list(CLI::App* app, const std::string& name, const std::string& what, PathList& out) {
  out.name = name;
  CLI::Option* comma = app->add_option("--" + name, out.comma, what + " files, comma-separated");
  CLI::Option* file = app->add_option("--" + name + "-file", out.list_file,
                                      "text file listing the " + what + " files, one path per line");
  comma->excludes(file);
}

std::vector<std::string> PathList::paths() const {
  MOERL_CHECK_INPUT(comma.empty() != list_file.empty(), "give exactly one of --", name,
                    "-file LIST (one path per line) and --", name, " F1,F2,...");
  std::vector<std::string> out;
  if (!comma.empty()) {
    std::istringstream is(comma);
    std::string p;
    while (std::getline(is, p, ','))
      if (!p.empty()) {
        MOERL_CHECK_INPUT(std::ifstream(p).good(), "--", name, ": cannot open ", p);
        out.push_back(p);
      }
  } else {
    std::istringstream is(io::read_file(list_file));
    std::string p;
    for (int n = 1; std::getline(is, p); n++) {
      if (!p.empty() && p.back() == '\r') p.pop_back();  // a list written with CRLF endings
      if (p.find_first_not_of(" \t") == std::string::npos) continue;
      MOERL_CHECK_INPUT(std::ifstream(p).good(), list_file, " line ", n, ": cannot open ", p);
      out.push_back(p);
    }
  }
  MOERL_CHECK_INPUT(!out.empty(), "--", name, comma.empty() ? "-file " + list_file : "",
                    " lists no files");
  return out;
}

Progress::Progress(double interval_s)
    : interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(interval_s))),
      last_(std::chrono::steady_clock::now()) {}

void Progress::maybe_print(const std::function<std::string()>& line) {
  auto now = std::chrono::steady_clock::now();
  if (now - last_ < interval_) return;
  last_ = now;
  std::printf("%s\n", line().c_str());
  std::fflush(stdout);
}

namespace {

template <typename T>
std::string int_array(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::string rollout_to_json(const RolloutRecord& r) {
  std::ostringstream os;
  os << "{\"prompt_id\":" << r.prompt_id << ",\"sample_index\":" << r.sample_index
     << ",\"iteration\":" << r.iteration << ",\"task\":" << io::json_quote(r.task)
     << ",\"prompt\":" << io::json_quote(r.prompt) << ",\"prompt_tokens\":" << int_array(r.prompt_tokens)
     << ",\"tokens\":" << int_array(r.tokens) << ",\"text\":" << io::json_quote(r.text)
     << ",\"logprobs\":[";
  for (size_t i = 0; i < r.logprobs.size(); i++) os << (i ? "," : "") << io::json_float(r.logprobs[i]);
  os << "],\"finish_reason\":" << io::json_quote(r.finish_reason);
  if (!r.loss_mask.empty()) {
    os << ",\"loss_mask\":[";
    for (size_t i = 0; i < r.loss_mask.size(); i++) os << (i ? "," : "") << (int)r.loss_mask[i];
    os << "]";
  }
  os << "}";
  return os.str();
}

std::vector<uint8_t> loss_mask_field(const io::Json& j, size_t completion, const std::string& what) {
  std::vector<uint8_t> mask;
  if (!j.contains("loss_mask")) return mask;
  for (const io::Json& m : io::array_field(j, "loss_mask", what)) {
    const int64_t v = io::as_integer(m, what + " loss_mask");
    MOERL_CHECK_INPUT(v == 0 || v == 1, what, " loss_mask: entry ", mask.size(), " is ", v,
                      "; each entry is 0 (an environment's token) or 1 (the policy's)");
    mask.push_back((uint8_t)v);
  }
  MOERL_CHECK_INPUT(mask.size() == completion, what, " loss_mask: ", mask.size(), " entries for ",
                    completion, " completion tokens");
  return mask;
}

std::vector<RolloutRecord> read_rollouts(const std::vector<std::string>& paths) {
  std::vector<RolloutRecord> out;
  for (const std::string& path : paths) {
    io::for_each_json_line(path, [&](const io::Json& j, const std::string& what) {
      RolloutRecord r;
      r.prompt_id = io::integer_field(j, "prompt_id", what);
      r.sample_index = io::integer_field(j, "sample_index", what);
      r.iteration = j.contains("iteration") ? io::integer_field(j, "iteration", what) : 0;
      r.task = j.contains("task") ? io::string_field(j, "task", what) : "";
      r.prompt = io::string_field(j, "prompt", what);
      for (const io::Json& t : io::array_field(j, "prompt_tokens", what))
        r.prompt_tokens.push_back((int32_t)io::as_integer(t, what + " prompt_tokens"));
      for (const io::Json& t : io::array_field(j, "tokens", what))
        r.tokens.push_back((int32_t)io::as_integer(t, what + " tokens"));
      r.text = io::string_field(j, "text", what);
      for (const io::Json& t : io::array_field(j, "logprobs", what))
        r.logprobs.push_back((float)io::as_number(t, what + " logprobs"));
      r.finish_reason = io::string_field(j, "finish_reason", what);
      MOERL_CHECK_INPUT(r.logprobs.size() == r.tokens.size(), what, ": ", r.logprobs.size(),
                        " logprobs for ", r.tokens.size(), " tokens");
      r.loss_mask = loss_mask_field(j, r.tokens.size(), what);
      out.push_back(std::move(r));
    });
  }
  return out;
}

}  // namespace moerl::tools
