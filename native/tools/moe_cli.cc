// Argument parsing, exit codes and rollout records for the moe_* tools.
#include "tools/moe_cli.h"

#include <cstdio>   // std::fprintf
#include <fstream>  // std::ifstream
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/json.h"

namespace moerl::tools {

Args::Args(int argc, char** argv, int first, const std::set<std::string>& switches) {
  for (int i = first; i < argc; i++) {
    std::string a = argv[i];
    MOERL_CHECK_INPUT(a.rfind("--", 0) == 0, "unexpected argument \"", a, "\" (flags are --name value)");
    std::string name = a.substr(2);
    if (switches.count(name)) {
      values_[name] = "1";
      continue;
    }
    MOERL_CHECK_INPUT(i + 1 < argc, "flag --", name, " needs a value");
    values_[name] = argv[++i];
  }
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  used_.insert(name);
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::required(const std::string& name) const {
  used_.insert(name);
  auto it = values_.find(name);
  MOERL_CHECK_INPUT(it != values_.end() && !it->second.empty(), "missing required flag --", name);
  return it->second;
}

std::vector<std::string> Args::list(const std::string& name) const {
  std::vector<std::string> out;
  std::string s = str(name, ""), cur;
  std::istringstream is(s);
  while (std::getline(is, cur, ','))
    if (!cur.empty()) out.push_back(cur);
  return out;
}

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  std::string s = str(name, "");
  if (s.empty()) return fallback;
  size_t pos = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  MOERL_CHECK_INPUT(pos == s.size() && pos > 0, "--", name, " must be an integer, got \"", s, "\"");
  return v;
}

double Args::number(const std::string& name, double fallback) const {
  std::string s = str(name, "");
  if (s.empty()) return fallback;
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  MOERL_CHECK_INPUT(pos == s.size() && pos > 0, "--", name, " must be a number, got \"", s, "\"");
  return v;
}

bool Args::flag(const std::string& name) const {
  used_.insert(name);
  return values_.count(name) > 0;
}

void Args::check_all_used() const {
  for (const auto& kv : values_)
    MOERL_CHECK_INPUT(used_.count(kv.first), "unknown flag --", kv.first);
}

int run_tool(const char* name, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return e.kind() == ErrorKind::BadInput ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
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
  os << "],\"finish_reason\":" << io::json_quote(r.finish_reason) << "}";
  return os.str();
}

std::vector<RolloutRecord> read_rollouts(const std::vector<std::string>& paths) {
  std::vector<RolloutRecord> out;
  for (const std::string& path : paths) {
    MOERL_CHECK_INPUT(std::ifstream(path).good(), "cannot open rollout file ", path);
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
      out.push_back(std::move(r));
    });
  }
  return out;
}

}  // namespace moerl::tools
