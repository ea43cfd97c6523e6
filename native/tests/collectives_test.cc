// allreduce (bitwise against a rank-order sequential sum), broadcast, gather and barrier over
// real rank processes, shm and tcp.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include "ep_spawn.h"

namespace moerl::ep::testing {
namespace {

void expect_all_pass(int world, const char* provider, size_t n) {
  const auto results =
      run_ranks(world, provider, 20, {MOERL_EP_TEST_RANK, "allreduce", std::to_string(n)});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
}

TEST(Collectives, OneRankIsLocal) { expect_all_pass(1, "shm", 1000); }
TEST(Collectives, TwoRanksShm) { expect_all_pass(2, "shm", 100003); }
TEST(Collectives, ThreeRanksShmUnevenSlices) { expect_all_pass(3, "shm", 10); }
TEST(Collectives, FourRanksShm) { expect_all_pass(4, "shm", 65536); }
TEST(Collectives, FourRanksTcp) { expect_all_pass(4, "tcp", 50000); }
TEST(Collectives, FewerElementsThanRanks) { expect_all_pass(4, "shm", 2); }

}  // namespace
}  // namespace moerl::ep::testing
