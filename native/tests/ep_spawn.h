// Spawns the R ranks of a multi-process test on this host (loopback only) and collects
// each rank's exit status and stderr. Ranks get the rank env contract (a job token
// included); rank 0 binds port 0 and publishes its port (transport/local_coordinator.h).
#pragma once

#include <arpa/inet.h>   // htonl
#include <netinet/in.h>  // sockaddr_in
#include <signal.h>      // kill, SIGKILL
#include <spawn.h>       // posix_spawn
#include <sys/socket.h>  // socket, bind
#include <sys/wait.h>    // waitpid
#include <unistd.h>      // close

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/local_coordinator.h"

extern char** environ;

namespace moerl::ep::testing {

struct RankResult {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;
  double seconds = 0;   // from spawn to exit
  std::string stderr_text;
};

inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

// Runs args_of(r) (argv[0] = the helper binary) as rank r of R; `while_running` (optional)
// is called every 20 ms with the pids (negated once exited), the elapsed seconds and the
// paths of the ranks' stderr files. Ranks still alive after wall_s are killed. extra_env
// entries ("NAME=value") are added to every rank's environment. The coordinator port is
// `coordinator_port` (a test that dials it), or when 0 the one rank 0 gets and publishes.
inline std::vector<RankResult> run_ranks_each(
    int world, const std::string& provider, double timeout_s,
    const std::function<std::vector<std::string>(int rank)>& args_of, double wall_s = 120,
    const std::function<void(const std::vector<pid_t>&, double, const std::vector<std::string>&)>&
        while_running = nullptr,
    const std::vector<std::string>& extra_env = {}, int coordinator_port = 0) {
  const transport::LocalCoordinator local;
  const std::vector<std::string> coordinator =
      coordinator_port != 0
          ? std::vector<std::string>{"MOERL_COORDINATOR=127.0.0.1:" + std::to_string(coordinator_port)}
          : local.env();
  const std::string group = local.id();  // names this group's token and files
  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  std::vector<std::string> err_paths(static_cast<size_t>(world));
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_strings = {
        "MOERL_RANK=" + std::to_string(r), "MOERL_WORLD_SIZE=" + std::to_string(world),
        "MOERL_FI_PROVIDER=" + provider, "MOERL_TIMEOUT_S=" + std::to_string(timeout_s),
        "MOERL_JOB_TOKEN=test-job-" + group};
    env_strings.insert(env_strings.end(), coordinator.begin(), coordinator.end());
    env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
    for (char** e = environ; *e != nullptr; ++e)
      if (std::string(*e).rfind("MOERL_", 0) != 0) env_strings.push_back(*e);
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args_copy = args_of(r);
    for (auto& s : args_copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    err_paths[size_t(r)] = ::testing::TempDir() + "ep_rank_" + std::to_string(::getpid()) + "_" +
                           group + "_" + std::to_string(r) + ".err";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, err_paths[size_t(r)].c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc =
        posix_spawn(&pids[size_t(r)], argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) ADD_FAILURE() << "posix_spawn " << args_copy[0] << " failed: " << rc;
  }
  std::vector<RankResult> results(static_cast<size_t>(world));
  int alive = world;
  while (alive > 0) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int r = 0; r < world; ++r) {
      if (pids[size_t(r)] <= 0) continue;
      int status = 0;
      if (::waitpid(pids[size_t(r)], &status, WNOHANG) == pids[size_t(r)]) {
        RankResult& res = results[size_t(r)];
        res.seconds = elapsed;
        res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        res.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        pids[size_t(r)] = -pids[size_t(r)];  // keep the pid (negated) for the callback
        --alive;
      } else if (elapsed > wall_s) {
        ::kill(pids[size_t(r)], SIGKILL);
      }
    }
    if (alive > 0) {
      if (while_running) while_running(pids, elapsed, err_paths);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream f(err_paths[size_t(r)]);
    std::stringstream ss;
    ss << f.rdbuf();
    results[size_t(r)].stderr_text = ss.str();
    std::remove(err_paths[size_t(r)].c_str());
  }
  return results;
}

// The same argv for every rank.
inline std::vector<RankResult> run_ranks(
    int world, const std::string& provider, double timeout_s, const std::vector<std::string>& args,
    double wall_s = 120,
    const std::function<void(const std::vector<pid_t>&, double, const std::vector<std::string>&)>&
        while_running = nullptr,
    const std::vector<std::string>& extra_env = {}) {
  return run_ranks_each(
      world, provider, timeout_s, [&](int) { return args; }, wall_s, while_running, extra_env);
}

inline std::string describe(const std::vector<RankResult>& results) {
  std::ostringstream os;
  for (size_t r = 0; r < results.size(); ++r)
    os << "rank " << r << ": exit " << results[r].exit_code << " signal " << results[r].signal
       << " after " << results[r].seconds << " s\n" << results[r].stderr_text;
  return os.str();
}

}  // namespace moerl::ep::testing
