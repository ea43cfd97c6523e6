// Character-level tokenizer shared by the tasks, the sampler and the tools.
// Ids: 0 <pad>, 1 <eos>, then one id per character of kChars in order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moerl::tasks {

constexpr int32_t kPad = 0;
constexpr int32_t kEos = 1;
// Every character a prompt or answer may contain, in id order starting at 2.
constexpr const char* kChars = "0123456789+=: ,abcdefghijklmnopqrstuvwxyz";
// Vocabulary size the policy is built with (2 specials + 41 chars, rounded up to 48).
constexpr int kVocabSize = 48;

// Throws BadInput naming the character and its position if it is not in kChars.
std::vector<int32_t> encode(const std::string& text);
// Stops at <eos>; <pad> and ids outside the table decode to nothing.
std::string decode(const std::vector<int32_t>& ids);

}  // namespace moerl::tasks
