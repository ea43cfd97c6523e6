// Character-level tokenizer.
#include "tasks/tokenizer.h"

#include <cstring>  // std::strchr, std::strlen

#include "common/check.h"

namespace moerl::tasks {

std::vector<int32_t> encode(const std::string& text) {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); i++) {
    const char* p = text[i] != '\0' ? std::strchr(kChars, text[i]) : nullptr;
    MOERL_CHECK_INPUT(p != nullptr, "character '", text[i], "' at position ", i, " of \"", text,
                      "\" is not in the tokenizer's alphabet");
    ids.push_back(2 + (int32_t)(p - kChars));
  }
  return ids;
}

std::string decode(const std::vector<int32_t>& ids) {
  static const int n = (int)std::strlen(kChars);
  std::string s;
  for (int32_t id : ids) {
    if (id == kEos) break;
    if (id >= 2 && id < 2 + n) s.push_back(kChars[id - 2]);
  }
  return s;
}

}  // namespace moerl::tasks
