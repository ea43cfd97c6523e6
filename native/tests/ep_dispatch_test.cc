// dispatch + combine against the single-process reference (ep_reference.h), 1/2/4 ranks over
// shm and tcp, for the routing and token-count cases of the issue. Each case runs R real
// processes of ep_test_rank; a case passes when every rank's outputs match bit for bit.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include "ep_spawn.h"

namespace moerl::ep::testing {
namespace {

struct EpCase {
  int world;
  const char* provider;
  int experts, topk, hidden, tokens;
  const char* token_rule;
  const char* routing;
  const char* dtype;
};

void PrintTo(const EpCase& c, std::ostream* os) {
  *os << c.world << " ranks over " << c.provider << ", E=" << c.experts << " K=" << c.topk
      << " C=" << c.hidden << " T=" << c.tokens << " " << c.token_rule << " " << c.routing << " "
      << c.dtype;
}

std::string name_of(const ::testing::TestParamInfo<EpCase>& info) {
  const EpCase& c = info.param;
  std::string n = std::string(c.provider) + "_r" + std::to_string(c.world) + "_" + c.routing +
                  "_" + c.token_rule + "_" + c.dtype + "_t" + std::to_string(c.tokens);
  return n;
}

class EpDispatch : public ::testing::TestWithParam<EpCase> {};

TEST_P(EpDispatch, MatchesReferenceBitwise) {
  const EpCase& c = GetParam();
  const auto results = run_ranks(
      c.world, c.provider, 20,
      {MOERL_EP_TEST_RANK, "ep", std::to_string(c.experts), std::to_string(c.topk),
       std::to_string(c.hidden), std::to_string(c.tokens), c.token_rule, c.routing, c.dtype, "7"});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EpDispatch,
    ::testing::Values(
        EpCase{1, "shm", 8, 2, 128, 50, "fixed", "random", "f32"},
        EpCase{1, "shm", 8, 2, 128, 50, "fixed", "minus1", "bf16"},
        EpCase{2, "shm", 8, 3, 128, 100, "fixed", "random", "f32"},
        EpCase{2, "shm", 8, 3, 256, 100, "fixed", "random", "bf16"},
        EpCase{2, "shm", 8, 2, 256, 60, "fixed", "random", "fp8"},
        EpCase{2, "shm", 8, 4, 64, 80, "varied", "minus1", "f32"},
        EpCase{2, "shm", 8, 2, 64, 80, "zero", "random", "bf16"},
        EpCase{2, "shm", 8, 2, 64, 80, "fixed", "one_expert", "f32"},
        EpCase{4, "shm", 16, 4, 128, 90, "varied", "random", "bf16"},
        EpCase{4, "shm", 8, 2, 64, 70, "zero", "minus1", "f32"},
        EpCase{4, "shm", 16, 4, 64, 70, "fixed", "one_expert", "bf16"},
        EpCase{4, "shm", 16, 4, 128, 70, "fixed", "skewed", "fp8"},
        // Rows of 32 KiB: every run of consecutive tokens qualifies for a direct segment, and
        // there are more runs than Handle::kMaxSegments allows, so direct and packed mix.
        EpCase{2, "shm", 8, 2, 8192, 700, "varied", "random", "f32"},
        EpCase{4, "shm", 16, 4, 32, 3000, "fixed", "skewed", "f32"},
        EpCase{2, "tcp", 8, 2, 128, 80, "varied", "random", "bf16"},
        EpCase{4, "tcp", 16, 4, 64, 60, "zero", "minus1", "f32"}),
    name_of);

// The memory-registration path efa takes (every buffer registered, descriptors passed),
// run over shm and tcp with MOERL_FI_REGISTER_ALL=1.
TEST(EpDispatchRegistered, MatchesReferenceBitwise) {
  for (const char* provider : {"shm", "tcp"}) {
    const auto results = run_ranks(
        3, provider, 20,
        {MOERL_EP_TEST_RANK, "ep", "6", "2", "256", "200", "varied", "minus1", "bf16", "3"}, 120,
        nullptr, {"MOERL_FI_REGISTER_ALL=1"});
    for (const auto& r : results)
      ASSERT_EQ(r.exit_code, 0) << provider << "\n" << describe(results);
  }
}

}  // namespace
}  // namespace moerl::ep::testing
