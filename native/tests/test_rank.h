// Shared by the rank programs of the multi-process EP tests (ep_test_rank, ep_ll_test_rank):
// the mismatch report and the dtype argument.
#pragma once

#include <cstdio>  // std::fprintf
#include <string>

#include "common/check.h"
#include "ep/ep.h"  // DType

namespace moerl::ep::testing {

// This process's rank, for messages; main sets it from the rank environment.
inline int g_rank = 0;

// In a check returning int: unless cond, print "rank R: mismatch: <printf args>", return 1.
#define EXPECT_SAME(cond, ...)                             \
  do {                                                     \
    if (!(cond)) {                                         \
      std::fprintf(stderr, "rank %d: mismatch: ", g_rank); \
      std::fprintf(stderr, __VA_ARGS__);                   \
      std::fprintf(stderr, "\n");                          \
      return 1;                                            \
    }                                                      \
  } while (0)

inline DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  if (s == "fp8") return DType::F8E4M3;
  MOERL_FAIL(BadInput, "unknown dtype '", s, "' (expected f32, bf16 or fp8)");
}

}  // namespace moerl::ep::testing
