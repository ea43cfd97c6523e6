// The bootstrap's rendezvous under a hostile network: rank 0 listens on the coordinator's
// address only; a port scan, garbage, a silent connection, a forged hello and a rank with
// another job's token, all during the rendezvous, change nothing for the job's own ranks; a
// rank that starts long after the others is no failure while the start-up deadline runs
// (the per-exchange deadline is for later); a rank lost during the rendezvous gives its place
// to its replacement, and a second live claim of a rank ends the attempt as a peer failure
// (the gang restarts), never as bad input; with port 0 rank 0 listens on a port the kernel
// picks and the others learn it from the port file. Ranks are Bootstrap objects on threads of
// this process, over 127.0.0.1 (no libfabric needed).
#include <arpa/inet.h>   // inet_pton
#include <fcntl.h>       // O_* for ep_spawn.h
#include <netinet/in.h>  // sockaddr_in
#include <sys/socket.h>  // socket, connect, send, recv
#include <sys/stat.h>    // stat for the port file's mode
#include <sys/time.h>    // timeval for SO_RCVTIMEO
#include <unistd.h>      // close

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "bad_input.h"
#include "common/check.h"
#include "ep_spawn.h"  // free_loopback_port
#include "transport/bootstrap.h"
#include "transport/clock.h"

namespace moerl::ep::testing {
namespace {

using transport::Bootstrap;
using transport::Config;
using transport::now_s;

Config rank_config(int rank, int port, const std::string& token) {
  Config c;
  c.rank = rank;
  c.world_size = 2;
  c.coordinator = "127.0.0.1:" + std::to_string(port);
  c.job_token = token;
  c.timeout_s = 0.5;  // per exchange: far shorter than the rendezvous below takes
  c.startup_timeout_s = 30;
  return c;
}

// A blocking TCP connection to ip:port, or -1 with errno set; connecting and reading give up
// after 5 s (Linux applies SO_SNDTIMEO to connect), so no case can hang the test.
int dial(const char* ip, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const timeval five_s{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five_s, sizeof(five_s));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &five_s, sizeof(five_s));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

int dial_when_listening(int port) {
  const double until = now_s() + 10;
  for (;;) {
    const int fd = dial("127.0.0.1", port);
    if (fd >= 0 || now_s() > until) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// One rank's rendezvous on a thread: its allgather result, or the error it threw (and its
// kind, which a tool turns into the exit code: PeerFailure 75, BadInput 2, others 1).
struct RankRun {
  std::vector<std::vector<uint8_t>> blobs;
  std::string error;
  moerl::ErrorKind kind = moerl::ErrorKind::Internal;
  double joined_after = -1;  // seconds from start to a finished bootstrap
  std::atomic<bool> admitted{false};  // rank 0 welcomed it (set before the allgather)
  std::thread thread;

  ~RankRun() {
    if (thread.joinable()) thread.join();
  }
  void start(const Config& config, std::unique_ptr<Bootstrap>& out) {
    thread = std::thread([this, config, &out] {
      const double t0 = now_s();
      try {
        out = std::make_unique<Bootstrap>(config);
        admitted = true;
        blobs = out->allgather({uint8_t(0xA0 + config.rank)});
        joined_after = now_s() - t0;
      } catch (const moerl::Error& e) {
        error = e.what();
        kind = e.kind();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
  void wait_admitted() const {
    for (const double until = now_s() + 10; !admitted && now_s() < until;)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
};

TEST(TransportBootstrap, StrangersDuringTheRendezvousChangeNothing) {
  const int port = free_loopback_port();
  std::unique_ptr<Bootstrap> b0, b1, impostor;
  RankRun rank0, rank1, other_job;
  rank0.start(rank_config(0, port, "job-token"), b0);

  // A port scan: connect and close at once (what killed the job before).
  const int scan = dial_when_listening(port);
  ASSERT_GE(scan, 0) << std::strerror(errno);
  ::close(scan);
  // Garbage, an HTTP health check, a hello cut short, then closed.
  for (const std::string& junk : {std::string(300, '\xff'), std::string("GET / HTTP/1.1\r\n\r\n"),
                                 std::string("PEOM\x02\0\0\0", 8)}) {
    const int fd = dial("127.0.0.1", port);
    ASSERT_GE(fd, 0);
    ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  // A forged hello: the right magic, version, rank and world size, but a MAC made without the
  // token. It reads the challenge first, as a rank does, and stays open afterwards.
  const int forged = dial("127.0.0.1", port);
  ASSERT_GE(forged, 0);
  uint8_t challenge[24];
  ASSERT_EQ(::recv(forged, challenge, sizeof(challenge), MSG_WAITALL), ssize_t(sizeof(challenge)));
  struct {
    uint32_t magic = 0x4d4f4550, version = 2;
    int32_t rank = 1, world_size = 2;
    uint8_t nonce[16] = {1}, mac[32] = {2};
  } hello;
  ASSERT_EQ(::send(forged, &hello, sizeof(hello), MSG_NOSIGNAL), ssize_t(sizeof(hello)));
  // A stranger that connects and says nothing, held open through the whole rendezvous.
  const int silent = dial("127.0.0.1", port);
  ASSERT_GE(silent, 0);
  // A rank 1 of another job (another token): refused until its own deadline, naming the token.
  Config wrong = rank_config(1, port, "another-job-token");
  wrong.startup_timeout_s = 1.0;
  other_job.start(wrong, impostor);
  other_job.thread.join();
  EXPECT_NE(other_job.error.find("MOERL_JOB_TOKEN"), std::string::npos) << other_job.error;

  // The job's own rank 1 is admitted at once, the silent stranger notwithstanding.
  rank1.start(rank_config(1, port, "job-token"), b1);
  rank1.thread.join();
  rank0.thread.join();
  ASSERT_EQ(rank0.error, "");
  ASSERT_EQ(rank1.error, "");
  EXPECT_LT(rank1.joined_after, 3.0);
  const std::vector<std::vector<uint8_t>> expected = {{0xA0}, {0xA1}};
  EXPECT_EQ(rank0.blobs, expected);
  EXPECT_EQ(rank1.blobs, expected);
  // Nobody's failure detector saw a failure; once every rank is in, nobody else gets in.
  EXPECT_NO_THROW(b0->check_peers());
  EXPECT_NO_THROW(b1->check_peers());
  EXPECT_LT(dial("127.0.0.1", port), 0);
  EXPECT_EQ(errno, ECONNREFUSED);
  ::close(forged);
  ::close(silent);
  b0->leave(true);
  b1->leave(true);
}

TEST(TransportBootstrap, PortScanDuringARealRendezvousChangesNothing) {
  // The reproduction with real rank processes over tcp: while rank 0 waits for rank 1
  // (started 3 s late, past the 2 s exchange deadline), connections that close at once and
  // garbage hit the coordinator port. Before, rank 0 died ("rank -1 died during start-up").
  const int port = free_loopback_port();
  bool probed = false;
  const auto results = run_ranks_each(
      2, "tcp", 2,
      [](int rank) {
        std::vector<std::string> args = {MOERL_EP_TEST_RANK, "allreduce", "1000"};
        if (rank == 1) args.insert(args.begin(), {"/bin/sh", "-c", "sleep 3; exec \"$0\" \"$@\""});
        return args;
      },
      60,
      [&](const std::vector<pid_t>&, double elapsed, const std::vector<std::string>&) {
        if (probed || elapsed < 1.0) return;
        for (int i = 0; i < 3; ++i) {
          const int fd = dial("127.0.0.1", port);
          if (fd >= 0) ::close(fd);
        }
        const int fd = dial("127.0.0.1", port);
        if (fd >= 0) {
          ::send(fd, "PEOM\x02\0\0\0garbage", 15, MSG_NOSIGNAL);
          ::close(fd);
        }
        probed = true;
      },
      {"MOERL_STARTUP_TIMEOUT_S=30"}, port);
  ASSERT_TRUE(probed);
  for (const RankResult& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
}

TEST(TransportBootstrap, ListensOnTheCoordinatorAddressOnly) {
  // 127.0.0.2 is this host too (all of 127/8 is loopback): listening on every interface, rank
  // 0 would answer there; listening on the coordinator's address, it must not.
  const int port = free_loopback_port();
  std::unique_ptr<Bootstrap> b0;
  RankRun rank0;
  Config c = rank_config(0, port, "t");
  c.startup_timeout_s = 2;
  rank0.start(c, b0);
  const int fd = dial_when_listening(port);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_LT(dial("127.0.0.2", port), 0);
  EXPECT_EQ(errno, ECONNREFUSED);
  rank0.thread.join();  // rank 1 never comes: rank 0 times out, naming it
  EXPECT_NE(rank0.error.find("rank(s) 1"), std::string::npos) << rank0.error;
}

TEST(TransportBootstrap, RankZeroListensOnItsResolvedCoordinatorHost) {
  // Without MOERL_BIND_ADDRESS rank 0 resolves the coordinator's host name (a pod's own DNS
  // name, here localhost) and listens there.
  const int port = free_loopback_port();
  std::unique_ptr<Bootstrap> b0, b1;
  RankRun rank0, rank1;
  Config c0 = rank_config(0, port, "t");
  c0.coordinator = "localhost:" + std::to_string(port);
  rank0.start(c0, b0);
  rank1.start(rank_config(1, port, "t"), b1);
  rank0.thread.join();
  rank1.thread.join();
  EXPECT_EQ(rank0.error, "");
  EXPECT_EQ(rank1.error, "");
  ASSERT_TRUE(b0 != nullptr);
  EXPECT_EQ(b0->local_ip(), "127.0.0.1");
}

TEST(TransportBootstrap, ASlowStartIsNoFailure) {
  // Rank 1 starts 2 s after rank 0 (pending pod, inputs downloading): four times the
  // per-exchange deadline, well within the start-up deadline.
  const int port = free_loopback_port();
  std::unique_ptr<Bootstrap> b0, b1;
  RankRun rank0, rank1;
  rank0.start(rank_config(0, port, "t"), b0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  rank1.start(rank_config(1, port, "t"), b1);
  rank0.thread.join();
  rank1.thread.join();
  EXPECT_EQ(rank0.error, "");
  EXPECT_EQ(rank1.error, "");
  EXPECT_EQ(rank0.blobs, rank1.blobs);
}

Config rank_of_three(int rank, int port) {
  Config c = rank_config(rank, port, "job-token");
  c.world_size = 3;
  return c;
}

TEST(TransportBootstrap, ARankLostDuringTheRendezvousGivesItsPlaceToItsReplacement) {
  // Rank 1 is admitted, then its process goes (a pod force-deleted) before rank 2 arrives;
  // its replacement claims rank 1. Nothing was exchanged yet: the replacement takes the place
  // and nobody restarts. Before, rank 0 failed the job as bad input ("two processes claim").
  const int port = free_loopback_port();
  std::unique_ptr<Bootstrap> b0, lost, b1, b2;
  RankRun rank0, rank1, rank2;
  rank0.start(rank_of_three(0, port), b0);
  std::thread([&] { lost = std::make_unique<Bootstrap>(rank_of_three(1, port)); }).join();
  lost.reset();  // the kernel closes a dead process's socket
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  rank1.start(rank_of_three(1, port), b1);
  rank1.wait_admitted();
  rank2.start(rank_of_three(2, port), b2);
  for (RankRun* r : {&rank0, &rank1, &rank2}) r->thread.join();
  ASSERT_EQ(rank0.error, "");
  ASSERT_EQ(rank1.error, "");
  ASSERT_EQ(rank2.error, "");
  const std::vector<std::vector<uint8_t>> expected = {{0xA0}, {0xA1}, {0xA2}};
  EXPECT_EQ(rank0.blobs, expected);
  EXPECT_EQ(rank1.blobs, expected);
  EXPECT_EQ(rank2.blobs, expected);
}

TEST(TransportBootstrap, ASecondLiveClaimEndsTheRendezvousAsAPeerFailureNotBadInput) {
  // A replacement claims rank 1 while the rank it replaces is still connected (its process
  // not gone yet). Rank 0 cannot tell which one is current: the attempt ends with
  // PeerFailure (exit 75: the gang restarts) on rank 0 and on every admitted rank, never
  // BadInput (exit 2, which fails the job and pauses the campaign for a transient fault). The
  // replacement was never admitted: it keeps dialling for the next rendezvous, until its own
  // deadline here.
  const int port = free_loopback_port();
  std::unique_ptr<Bootstrap> b0, old1, new1;
  RankRun rank0, old_rank1, new_rank1;
  rank0.start(rank_of_three(0, port), b0);
  old_rank1.start(rank_of_three(1, port), old1);
  old_rank1.wait_admitted();
  ASSERT_TRUE(old_rank1.admitted);
  Config replacement = rank_of_three(1, port);
  replacement.startup_timeout_s = 2.0;
  new_rank1.start(replacement, new1);
  for (RankRun* r : {&rank0, &old_rank1, &new_rank1}) r->thread.join();
  EXPECT_EQ(rank0.kind, moerl::ErrorKind::PeerFailure) << rank0.error;
  EXPECT_NE(rank0.error.find("two processes claim MOERL_RANK=1"), std::string::npos) << rank0.error;
  EXPECT_EQ(old_rank1.kind, moerl::ErrorKind::PeerFailure) << old_rank1.error;
  EXPECT_FALSE(new_rank1.admitted);
  EXPECT_EQ(new_rank1.kind, moerl::ErrorKind::Timeout) << new_rank1.error;
}

TEST(TransportBootstrap, StartupDeadlineStillEnds) {
  // A rank 1 whose rank 0 never comes gives up at the start-up deadline, not before.
  Config c = rank_config(1, free_loopback_port(), "t");
  c.startup_timeout_s = 1.0;
  const double t0 = now_s();
  try {
    Bootstrap b(c);
    FAIL() << "joined a coordinator that does not exist";
  } catch (const moerl::Error& e) {
    EXPECT_EQ(e.kind(), moerl::ErrorKind::Timeout);
    EXPECT_NE(std::string(e.what()).find("within 1 s"), std::string::npos) << e.what();
  }
  EXPECT_GE(now_s() - t0, 0.9);
}

// A port file in a fresh directory of the test's own, both removed when it goes.
struct PortFile {
  std::string dir = "/tmp/moerl-port-file-XXXXXX", path;
  PortFile() {
    EXPECT_NE(::mkdtemp(dir.data()), nullptr) << std::strerror(errno);
    path = dir + "/coordinator.port";
  }
  ~PortFile() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
};

TEST(TransportBootstrap, PortZeroRankZeroPublishesTheKernelsPortAndTheOthersJoinThroughTheFile) {
  // No port is chosen, released and bound later (another local user could take it first):
  // rank 0 binds port 0 and publishes what it got. Rank 1 starts first and waits for the file.
  const PortFile port_file;
  const std::string& file = port_file.path;
  std::unique_ptr<Bootstrap> b0, b1;
  RankRun rank0, rank1;
  Config c0 = rank_config(0, 0, "t"), c1 = rank_config(1, 0, "t");
  c0.coordinator_port_file = c1.coordinator_port_file = file;
  c0.startup_timeout_s = c1.startup_timeout_s = 10;
  rank1.start(c1, b1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  rank0.start(c0, b0);
  rank0.thread.join();
  rank1.thread.join();
  EXPECT_EQ(rank0.error, "");
  EXPECT_EQ(rank1.error, "");
  EXPECT_EQ(rank0.blobs, rank1.blobs);
  int port = 0;
  std::ifstream(file) >> port;
  EXPECT_GE(port, 1);
  EXPECT_LE(port, 65535);
  struct stat st{};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(TransportBootstrap, PortZeroRankWaitsForThePortFileUntilTheStartupDeadline) {
  const PortFile port_file;
  Config c = rank_config(1, 0, "t");
  c.coordinator_port_file = port_file.path;
  c.startup_timeout_s = 1.0;
  try {
    Bootstrap b(c);
    FAIL() << "joined a rank 0 that never published its port";
  } catch (const moerl::Error& e) {
    EXPECT_EQ(e.kind(), moerl::ErrorKind::Timeout);
    const std::string what = e.what();
    EXPECT_NE(what.find("within 1 s"), std::string::npos) << what;
    EXPECT_NE(what.find("has not published its port in MOERL_COORDINATOR_PORT_FILE " +
                        c.coordinator_port_file),
              std::string::npos)
        << what;
  }
}

TEST(TransportConfig, PortZeroNeedsThePortFile) {
  setenv("MOERL_WORLD_SIZE", "2", 1);
  setenv("MOERL_COORDINATOR", "127.0.0.1:0", 1);
  unsetenv("MOERL_COORDINATOR_PORT_FILE");
  EXPECT_NE(moerl::testing::bad_input([] { Config::from_env(); })
                .find("has port 0 (rank 0 takes a port the kernel picks) but "
                      "MOERL_COORDINATOR_PORT_FILE"),
            std::string::npos);
  setenv("MOERL_COORDINATOR_PORT_FILE", "/job/coordinator.port", 1);
  EXPECT_EQ(Config::from_env().coordinator_port_file, "/job/coordinator.port");
  for (const char* name : {"MOERL_WORLD_SIZE", "MOERL_COORDINATOR", "MOERL_COORDINATOR_PORT_FILE"})
    unsetenv(name);
}

TEST(TransportConfig, StartupDeadlineTokenAndBindAddressFromEnv) {
  setenv("MOERL_TIMEOUT_S", "7", 1);
  unsetenv("MOERL_STARTUP_TIMEOUT_S");
  setenv("MOERL_JOB_TOKEN", "abc", 1);
  setenv("MOERL_BIND_ADDRESS", "10.0.3.7", 1);
  Config c = Config::from_env();
  EXPECT_EQ(c.timeout_s, 7);
  EXPECT_EQ(c.startup_timeout_s, 7);  // unset: the exchange deadline
  EXPECT_EQ(c.job_token, "abc");
  EXPECT_EQ(c.bind_address, "10.0.3.7");
  setenv("MOERL_STARTUP_TIMEOUT_S", "900", 1);
  EXPECT_EQ(Config::from_env().startup_timeout_s, 900);
  for (const char* bad : {"soon", "0", "-5", "1e9"}) {
    setenv("MOERL_STARTUP_TIMEOUT_S", bad, 1);
    try {
      Config::from_env();
      ADD_FAILURE() << bad;
    } catch (const moerl::Error& e) {
      EXPECT_EQ(e.kind(), moerl::ErrorKind::BadInput);
      EXPECT_NE(std::string(e.what()).find("MOERL_STARTUP_TIMEOUT_S"), std::string::npos);
    }
  }
  unsetenv("MOERL_STARTUP_TIMEOUT_S");
  setenv("MOERL_BIND_ADDRESS", "0.0.0.0.0", 1);
  EXPECT_THROW(Config::from_env(), moerl::Error);
  for (const char* name : {"MOERL_TIMEOUT_S", "MOERL_JOB_TOKEN", "MOERL_BIND_ADDRESS"})
    unsetenv(name);
}

}  // namespace
}  // namespace moerl::ep::testing
