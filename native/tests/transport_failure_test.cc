// Failure behaviour of the rank contract: a rank killed mid-dispatch makes every other rank
// exit non-zero within the deadline, naming the dead rank; a missing rank at start-up is
// named by rank 0; malformed env is exit code 2.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include "ep_spawn.h"
#include "transport/communicator.h"
#include "common/check.h"

namespace moerl::ep::testing {
namespace {

void kill_mid_dispatch(int world, const char* provider) {
  const double timeout_s = 2;
  const int victim = 1;
  bool killed = false;
  const auto results = run_ranks(
      world, provider, timeout_s, {MOERL_EP_TEST_RANK, "loop", "64"}, 60,
      [&](const std::vector<pid_t>& pids, double elapsed) {
        // Give the ranks time to connect and loop, then kill one between two messages.
        if (!killed && elapsed > 1.0 && pids[victim] > 0) {
          ::kill(pids[victim], SIGKILL);
          killed = true;
        }
      });
  ASSERT_TRUE(killed);
  EXPECT_EQ(results[victim].signal, SIGKILL) << describe(results);
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    EXPECT_NE(results[size_t(r)].exit_code, 0) << describe(results);
    EXPECT_EQ(results[size_t(r)].signal, 0) << describe(results);
    // Killed at ~1 s; survivors must be out within the deadline plus scheduling slack.
    EXPECT_LT(results[size_t(r)].seconds, 1.0 + 3 * timeout_s + 3) << describe(results);
    EXPECT_NE(results[size_t(r)].stderr_text.find("rank " + std::to_string(victim)),
              std::string::npos)
        << describe(results);
  }
}

TEST(TransportFailure, RankKilledMidDispatchShm) { kill_mid_dispatch(3, "shm"); }
TEST(TransportFailure, RankKilledMidDispatchTcp) { kill_mid_dispatch(3, "tcp"); }

TEST(TransportFailure, MissingRankIsNamedByCoordinator) {
  // Rank 0 of a world of 2 whose rank 1 never starts must fail in time, naming rank 1.
  transport::Config config;
  config.rank = 0;
  config.world_size = 2;
  config.coordinator = "127.0.0.1:" + std::to_string(free_loopback_port());
  config.timeout_s = 0.5;
  try {
    transport::Communicator comm(config);
    FAIL() << "construction succeeded without rank 1";
  } catch (const moerl::Error& e) {
    EXPECT_EQ(e.kind(), moerl::ErrorKind::Timeout);
    EXPECT_NE(std::string(e.what()).find("rank(s) 1"), std::string::npos) << e.what();
  }
}

TEST(TransportConfig, RejectsBadEnvWithTheVariableName) {
  transport::Config c;
  c.world_size = 2;
  c.rank = 2;
  c.coordinator = "h:1";
  try {
    c.validate();
    FAIL();
  } catch (const moerl::Error& e) {
    EXPECT_EQ(e.kind(), moerl::ErrorKind::BadInput);
    EXPECT_NE(std::string(e.what()).find("MOERL_RANK"), std::string::npos);
  }
  c.rank = 0;
  c.provider = "ib";
  EXPECT_THROW(c.validate(), moerl::Error);
  c.provider = "tcp";
  c.coordinator = "nohostport";
  EXPECT_THROW(c.validate(), moerl::Error);
}

TEST(TransportConfig, OneRankNeedsNoNetwork) {
  transport::Config c;
  transport::Communicator comm(c);
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.provider_name(), "none");
  float v[3] = {1, 2, 3};
  comm.allreduce_sum(v, 3);
  comm.barrier();
  comm.broadcast(v, sizeof(v), 0);
  EXPECT_EQ(v[2], 3.0f);
}

}  // namespace
}  // namespace moerl::ep::testing
