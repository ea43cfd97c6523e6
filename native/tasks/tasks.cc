// Built-in verifiable tasks. Generators draw from splitmix64 seeded by
// (seed, task, split, prompt id, attempt); an attempt is redrawn until the prompt lands in
// the requested split, which keeps Eval disjoint from Train by construction.
#include "tasks/tasks.h"

#include <algorithm>  // std::sort, std::reverse

#include "common/check.h"

namespace moerl::tasks {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform integer in [lo, hi].
int64_t uniform(uint64_t& s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(splitmix64(s) % (uint64_t)(hi - lo + 1));
}

std::string draw_text(const std::string& task, uint64_t& s) {
  if (task == "add") {
    auto number = [&] {
      int digits = (int)uniform(s, 1, 3);
      int64_t lo = digits == 1 ? 0 : (digits == 2 ? 10 : 100);
      int64_t hi = digits == 1 ? 9 : (digits == 2 ? 99 : 999);
      return std::to_string(uniform(s, lo, hi));
    };
    std::string a = number();
    std::string b = number();
    return a + "+" + b + "=";
  }
  if (task == "sort") {
    int n = (int)uniform(s, 3, 8);
    std::string d;
    for (int i = 0; i < n; i++) d.push_back((char)('0' + uniform(s, 0, 9)));
    return "sort:" + d + "=";
  }
  // reverse
  int n = (int)uniform(s, 3, 8);
  std::string d;
  for (int i = 0; i < n; i++) d.push_back((char)('a' + uniform(s, 0, 25)));
  return "rev:" + d + "=";
}

bool all_of_range(const std::string& s, char lo, char hi) {
  for (char c : s)
    if (c < lo || c > hi) return false;
  return true;
}

}  // namespace

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"add", "sort", "reverse"};
  return names;
}

void check_task(const std::string& task) {
  for (const std::string& n : task_names())
    if (n == task) return;
  MOERL_FAIL(BadInput, "unknown task \"", task, "\"; known tasks: add, sort, reverse");
}

uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

Prompt make_prompt(const std::string& task, Split split, uint64_t seed, int64_t prompt_id) {
  check_task(task);
  MOERL_CHECK_INPUT(prompt_id >= 0, "prompt id must be >= 0, got ", prompt_id);
  for (uint64_t attempt = 0;; attempt++) {
    uint64_t s = seed;
    s ^= splitmix64(s) ^ fnv1a32(task);
    s ^= splitmix64(s) ^ (uint64_t)(split == Split::Eval);
    s ^= splitmix64(s) ^ (uint64_t)prompt_id;
    s ^= splitmix64(s) ^ attempt;
    std::string text = draw_text(task, s);
    bool is_eval = fnv1a32(text) % 10 == 0;
    if (is_eval != (split == Split::Eval)) continue;
    return Prompt{prompt_id, text, answer_for(task, text)};
  }
}

std::string answer_for(const std::string& task, const std::string& p) {
  check_task(task);
  MOERL_CHECK_INPUT(!p.empty() && p.back() == '=', "prompt \"", p, "\" of task ", task,
                    " must end with '='");
  std::string body = p.substr(0, p.size() - 1);
  if (task == "add") {
    size_t plus = body.find('+');
    MOERL_CHECK_INPUT(plus != std::string::npos && plus > 0 && plus + 1 < body.size(),
                      "add prompt \"", p, "\" must look like A+B=");
    std::string a = body.substr(0, plus), b = body.substr(plus + 1);
    MOERL_CHECK_INPUT(all_of_range(a, '0', '9') && all_of_range(b, '0', '9') && a.size() <= 9 &&
                          b.size() <= 9,
                      "add prompt \"", p, "\" must hold two decimal numbers of at most 9 digits");
    return std::to_string(std::stoll(a) + std::stoll(b));
  }
  if (task == "sort") {
    MOERL_CHECK_INPUT(body.rfind("sort:", 0) == 0 && all_of_range(body.substr(5), '0', '9'),
                      "sort prompt \"", p, "\" must look like sort:DIGITS=");
    std::string d = body.substr(5);
    std::sort(d.begin(), d.end());
    return d;
  }
  MOERL_CHECK_INPUT(body.rfind("rev:", 0) == 0 && all_of_range(body.substr(4), 'a', 'z'),
                    "reverse prompt \"", p, "\" must look like rev:LETTERS=");
  std::string d = body.substr(4);
  std::reverse(d.begin(), d.end());
  return d;
}

float reward(const std::string& task, const std::string& prompt_text,
             const std::string& completion, bool stopped) {
  return stopped && completion == answer_for(task, prompt_text) ? 1.0f : 0.0f;
}

}  // namespace moerl::tasks
