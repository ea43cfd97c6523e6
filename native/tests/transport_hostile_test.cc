// The data plane under hostile input: a stranger endpoint (one that never joined the
// authenticated rendezvous) that sends a rank a well-formed message with a peer's tag is not
// taken for that peer, and a peer whose dispatch counts are out of range gets a clear error
// naming it and the value (file and line), not an allocation failure or a write out of
// bounds. Ranks are ep_test_rank processes (modes stranger and forged_counts).
#include <fcntl.h>   // O_* for ep_spawn.h
#include <unistd.h>  // geteuid

#include <string>

#include <gtest/gtest.h>

#include "ep_spawn.h"

namespace moerl::ep::testing {
namespace {

void stranger_is_not_a_peer(const std::string& provider) {
  const auto results = run_ranks(2, provider, 60, {MOERL_EP_TEST_RANK, "stranger"});
  const std::string all = describe(results);
  ASSERT_NE(results[1].stderr_text.find("the stranger's message was sent"), std::string::npos)
      << all;
  EXPECT_EQ(results[0].exit_code, 0) << all;
  EXPECT_EQ(results[1].exit_code, 0) << all;
}

// Over tcp (the network a stranger can reach; efa binds receives the same way).
TEST(TransportHostile, StrangerWithAPeersTagIsNotTakenForItTcp) { stranger_is_not_a_peer("tcp"); }

// Over shm, directed receives do not tell a process that maps the rank's region from the peer
// it claims to be, so the boundary is the region's mode (0600, checked as each endpoint
// opens): a stranger of another uid cannot reach rank 0 at all.
TEST(TransportHostile, StrangerOfAnotherUidCannotReachAShmRank) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run the stranger as uid 65534";
  const auto results = run_ranks(2, "shm", 60, {MOERL_EP_TEST_RANK, "stranger_uid"});
  const std::string all = describe(results);
  EXPECT_NE(results[1].stderr_text.find("the stranger could not reach rank 0"), std::string::npos)
      << all;
  EXPECT_EQ(results[0].exit_code, 0) << all;
  EXPECT_EQ(results[1].exit_code, 0) << all;
}

void forged_counts_are_refused(const std::string& num_rows) {
  const auto results = run_ranks(2, "tcp", 60, {MOERL_EP_TEST_RANK, "forged_counts", num_rows});
  const std::string all = describe(results);
  EXPECT_EQ(results[0].exit_code, 3) << all;
  EXPECT_NE(results[0].stderr_text.find("dispatch.cc:"), std::string::npos) << all;
  EXPECT_NE(results[0].stderr_text.find("rank 0: rank 1 sent a corrupt dispatch counts message: "
                                        "num_rows=" + num_rows),
            std::string::npos)
      << all;
  EXPECT_EQ(results[1].exit_code, 3) << all;  // its barrier names rank 0's failure
  EXPECT_NE(results[1].stderr_text.find("rank 0"), std::string::npos) << all;
}

TEST(TransportHostile, DispatchRefusesHugeNumRows) { forged_counts_are_refused("1099511627776"); }
TEST(TransportHostile, DispatchRefusesNegativeNumRows) { forged_counts_are_refused("-5"); }

}  // namespace
}  // namespace moerl::ep::testing
