// Verifiable synthetic tasks: deterministic prompt generators and exact-match verifiers.
// The format of each task is documented in docs/tasks.md; the TypeScript reward verifiers
// implement it independently, so any change here must change that document too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moerl::tasks {

enum class Split { Train, Eval };

struct Prompt {
  int64_t prompt_id = 0;
  std::string text;    // e.g. "47+815="
  std::string answer;  // e.g. "862"; the completion must be exactly this, then <eos>
  std::vector<int32_t> tokens;  // given token ids (a model's own tokenizer); empty: encode(text)
};

// Names of the built-in tasks: "add", "sort", "reverse".
const std::vector<std::string>& task_names();
// Throws BadInput listing the known names when `task` is unknown.
void check_task(const std::string& task);

// Deterministic in (task, split, seed, prompt_id). Eval prompts are disjoint from train
// prompts: a prompt belongs to Eval iff fnv1a32(text) % 10 == 0.
Prompt make_prompt(const std::string& task, Split split, uint64_t seed, int64_t prompt_id);

// The expected answer for a prompt text, computed from the text alone (what a verifier
// does). Throws BadInput if the text is not a prompt of `task`.
std::string answer_for(const std::string& task, const std::string& prompt_text);

// 1 if the completion (text before <eos>) equals the answer and generation stopped at <eos>.
float reward(const std::string& task, const std::string& prompt_text,
             const std::string& completion, bool stopped);

uint32_t fnv1a32(const std::string& s);

}  // namespace moerl::tasks
