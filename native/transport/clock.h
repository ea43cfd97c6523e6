// Monotonic seconds, for deadlines.
#pragma once

#include <chrono>  // std::chrono::steady_clock

namespace moerl::transport {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace moerl::transport
