// Failure behaviour of the rank contract: a rank killed mid-dispatch makes every other rank
// exit non-zero within the deadline, naming the dead rank; a missing rank at start-up is
// named by rank 0; malformed env is exit code 2.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include "ep_spawn.h"
#include "transport/bootstrap.h"
#include "transport/communicator.h"
#include "transport/watchdog.h"
#include "common/check.h"

namespace moerl::ep::testing {
namespace {

void kill_mid_dispatch(int world, const char* provider, int victim) {
  const double timeout_s = 2;
  bool killed = false;
  double ready_at = -1, killed_at = 0;
  const auto results = run_ranks(
      world, provider, timeout_s, {MOERL_EP_TEST_RANK, "loop", "64"}, 60,
      [&](const std::vector<pid_t>& pids, double elapsed, const std::vector<std::string>& errs) {
        // Once every rank says it is looping (connected, exchanging), wait a little so the
        // kill lands between two messages of a dispatch or combine.
        if (killed || pids[victim] <= 0) return;
        if (ready_at < 0) {
          for (const auto& path : errs) {
            std::ifstream f(path);
            std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
            if (text.find("looping") == std::string::npos) return;
          }
          ready_at = elapsed;
        }
        if (elapsed > ready_at + 0.2) {
          ::kill(pids[victim], SIGKILL);
          killed_at = elapsed;
          killed = true;
        }
      },
      // The start-up has its own deadline: on a loaded host forming the group can take longer
      // than the exchange deadline under test, and a rank that gave up then is no kill at all.
      {"MOERL_STARTUP_TIMEOUT_S=30"});
  ASSERT_TRUE(killed) << "no rank was killed: the group ended first\n" << describe(results);
  EXPECT_EQ(results[victim].signal, SIGKILL) << describe(results);
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    EXPECT_NE(results[size_t(r)].exit_code, 0) << describe(results);
    EXPECT_EQ(results[size_t(r)].signal, 0) << describe(results);
    // Survivors must be out within the deadline (plus scheduling slack on a busy host).
    EXPECT_LT(results[size_t(r)].seconds, killed_at + timeout_s + 2) << describe(results);
    // The failure detector names the dead rank itself, not a live rank stuck waiting for it.
    EXPECT_NE(results[size_t(r)].stderr_text.find("rank " + std::to_string(victim) + " died"),
              std::string::npos)
        << describe(results);
  }
}

TEST(TransportFailure, RankKilledMidDispatchShm) { kill_mid_dispatch(3, "shm", 1); }
TEST(TransportFailure, RankKilledMidDispatchTcp) { kill_mid_dispatch(3, "tcp", 1); }
TEST(TransportFailure, CoordinatorKilledMidDispatchShm) { kill_mid_dispatch(4, "shm", 0); }

TEST(TransportFailure, RankThatThrowsIsNamedByTheOthers) {
  // Rank 2 throws mid-run; its communicator tells the group on the way out, so the others
  // stop at once (well before the 10 s deadline) and name it.
  const auto results = run_ranks(4, "shm", 10, {MOERL_EP_TEST_RANK, "loop", "64", "2"}, 60);
  EXPECT_EQ(results[2].exit_code, 3) << describe(results);
  for (int r : {0, 1, 3}) {
    EXPECT_NE(results[size_t(r)].exit_code, 0) << describe(results);
    EXPECT_LT(results[size_t(r)].seconds, results[2].seconds + 5) << describe(results);
    EXPECT_NE(results[size_t(r)].stderr_text.find("rank 2 failed"), std::string::npos)
        << describe(results);
  }
}

// A call into libfabric that never returns (a peer died holding a lock in shared memory)
// ends the process with exit code 3 and a message, instead of hanging.
TEST(TransportWatchdog, EndsAProcessStuckInsideLibfabric) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        transport::Config config;
        config.coordinator = "127.0.0.1:" + std::to_string(free_loopback_port());
        config.timeout_s = 0.3;
        transport::Bootstrap bootstrap(config);  // a world of one: nobody to wait for
        transport::Watchdog watchdog(bootstrap, 0, config.timeout_s);
        watchdog.enter_fabric();
        std::this_thread::sleep_for(std::chrono::seconds(10));
      },
      ::testing::ExitedWithCode(transport::Watchdog::kExitStuck), "stuck inside libfabric");
}

TEST(TransportFailure, MissingRankIsNamedByCoordinator) {
  // Rank 0 of a world of 2 whose rank 1 never starts must fail in time, naming rank 1.
  transport::Config config;
  config.rank = 0;
  config.world_size = 2;
  config.coordinator = "127.0.0.1:" + std::to_string(free_loopback_port());
  config.startup_timeout_s = 0.5;
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
  c.coordinator = "host:http";
  EXPECT_THROW(c.validate(), moerl::Error);
  c.coordinator = "host:70000";
  EXPECT_THROW(c.validate(), moerl::Error);
  c.coordinator = "trainer-0.trainer:29500";
  EXPECT_NO_THROW(c.validate());
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
