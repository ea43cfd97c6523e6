// ep_bench: dispatch/combine bandwidth of the EP core, with two references measured in the
// same run: this machine's memcpy bandwidth (all ranks copying at once, as they run) and a
// dispatch/combine built on MPI_Alltoallv (ep_bench_mpi, launched through mpirun).
//
//   ep_bench --ranks 2 --provider shm --tokens 4096 --hidden 2048 --experts 16 --topk 4
//            --dtype bf16 [--routing uniform|skewed] [--iters 20] [--warmup 3] [--json] [--no-mpi]
//
// Without MOERL_RANK in the environment it is the launcher: it spawns --ranks copies of
// itself on this host (loopback coordinator), then the MPI baseline, and prints one report
// (one JSON object with --json). With MOERL_RANK set it is one rank of a pod group and rank 0
// prints the report of our figures only.
#include <spawn.h>     // posix_spawn
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // readlink, pipe, geteuid

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>  // std::thread::hardware_concurrency
#include <vector>

#include "common/check.h"
#include "ep_bench_common.h"
#include "transport/clock.h"
#include "transport/communicator.h"
#include "transport/local_coordinator.h"

extern char** environ;

namespace moerl::bench {
namespace {

std::string run_rank(const Options& o, const transport::Config& config) {
  transport::Communicator comm(config);
  const int R = comm.world_size(), self = comm.rank();
  ep::Buffer buffer(comm, o.experts);
  const Routing routing = make_routing(o, self);
  ep::HostBytes x;  // inputs on huge pages too, as host_memory.h recommends
  std::vector<float> scales;
  make_payload(o, self, x, scales);
  const ep::DType dt = payload_dtype(o), cdt = combine_dtype(o);
  const ep::TensorView xv{x.data(), dt, o.tokens, o.hidden};

  ep::Layout layout;
  buffer.get_dispatch_layout(routing.topk_idx.data(), o.tokens, o.topk, layout);
  ep::DispatchOut out;
  ep::Tensor y, combined;
  auto dispatch = [&] {
    buffer.dispatch(xv, scales.empty() ? nullptr : scales.data(), routing.topk_idx.data(),
                    routing.topk_weights.data(), layout, out);
  };
  dispatch();
  const int64_t N = out.handle.num_recv_tokens;
  // Expert outputs to combine: the received rows themselves when the dtype allows.
  if (cdt == dt) y = out.recv_x;
  else y.resize(cdt, N, o.hidden);
  const size_t dispatch_bytes = size_t(N) * size_t(o.hidden) * ep::dtype_bytes(dt);
  const size_t combine_bytes = size_t(N) * size_t(o.hidden) * ep::dtype_bytes(cdt);
  ep::HostBytes copy_src(dispatch_bytes, 1), copy_dst(dispatch_bytes, 0);  // same memory kind
  for (int i = 0; i < o.warmup; ++i) {
    dispatch();
    buffer.combine(y.view(), out.handle, combined);
    std::memcpy(copy_dst.data(), copy_src.data(), dispatch_bytes);
  }

  const int I = o.iters;
  std::vector<float> t_dispatch(size_t(R * I), 0.0f), t_combine(size_t(R * I), 0.0f),
      t_memcpy(size_t(R * I), 0.0f);
  for (int i = 0; i < I; ++i) {
    const size_t at = size_t(self * I + i);
    comm.barrier();
    double t0 = transport::now_s();
    dispatch();
    t_dispatch[at] = float(transport::now_s() - t0);
    comm.barrier();
    t0 = transport::now_s();
    buffer.combine(y.view(), out.handle, combined);
    t_combine[at] = float(transport::now_s() - t0);
    comm.barrier();
    t0 = transport::now_s();
    std::memcpy(copy_dst.data(), copy_src.data(), dispatch_bytes);
    t_memcpy[at] = float(transport::now_s() - t0);
  }
  comm.allreduce_sum(t_dispatch.data(), t_dispatch.size());
  comm.allreduce_sum(t_combine.data(), t_combine.size());
  comm.allreduce_sum(t_memcpy.data(), t_memcpy.size());
  float sums[3] = {float(dispatch_bytes), float(combine_bytes), float(N)};
  comm.allreduce_sum(sums, 3);
  if (self != 0) return {};

  auto to_d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  const double td = median_of_max(to_d(t_dispatch), R, I);
  const double tc = median_of_max(to_d(t_combine), R, I);
  const double tm = median_of_max(to_d(t_memcpy), R, I);
  const double bytes_d = sums[0] / R, bytes_c = sums[1] / R;
  std::ostringstream js;
  js.precision(4);
  js << std::fixed << "{\"ranks\": " << R << ", \"provider\": \"" << comm.config().provider
     << "\", \"fi_provider\": \"" << comm.provider_name() << "\", \"tokens\": " << o.tokens
     << ", \"hidden\": " << o.hidden << ", \"experts\": " << o.experts << ", \"topk\": " << o.topk
     << ", \"dtype\": \"" << o.dtype << "\", \"combine_dtype\": \"" << ep::dtype_name(cdt)
     << "\", \"routing\": \"" << o.routing << "\", \"warmup\": " << o.warmup
     << ", \"iters\": " << I << ", \"recv_tokens_per_rank\": " << sums[2] / R
     << ", \"dispatch_us\": " << td * 1e6 << ", \"combine_us\": " << tc * 1e6
     << ", \"memcpy_us\": " << tm * 1e6 << ", \"dispatch_gbps\": " << bytes_d / td / 1e9
     << ", \"combine_gbps\": " << bytes_c / tc / 1e9 << ", \"memcpy_gbps\": "
     << bytes_d / tm / 1e9 << "}";
  return js.str();
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  MOERL_CHECK(n > 0, "cannot find this executable's path");
  return std::string(buf, size_t(n));
}

// Spawns argv with extra env; returns pid. stdout goes to out_fd when >= 0.
pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
            int out_fd) {
  std::vector<std::string> env = extra_env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::vector<char*> argv, envp;
  std::vector<std::string> a = args;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  MOERL_CHECK(rc == 0, "cannot start ", args[0], ": ", std::strerror(rc));
  return pid;
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) s.append(buf, size_t(n));
  return s;
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs one process (or a group) and returns its stdout and exit code.
std::string capture(const std::vector<std::vector<std::string>>& procs,
                    const std::vector<std::vector<std::string>>& envs, int& exit_code) {
  int fds[2];
  MOERL_CHECK(pipe(fds) == 0, "pipe: ", std::strerror(errno));
  std::vector<pid_t> pids;
  for (size_t i = 0; i < procs.size(); ++i)
    pids.push_back(spawn(procs[i], envs[i], i == 0 ? fds[1] : -1));
  close(fds[1]);
  const std::string out = read_all(fds[0]);
  close(fds[0]);
  exit_code = 0;
  for (pid_t p : pids) {
    const int rc = wait_exit(p);
    if (rc != 0 && exit_code == 0) exit_code = rc;
  }
  return out;
}

double json_number(const std::string& js, const std::string& key) {
  const auto at = js.find("\"" + key + "\":");
  return at == std::string::npos ? -1.0 : std::strtod(js.c_str() + at + key.size() + 3, nullptr);
}

int launch(const Options& o) {
  const std::string exe = self_path();
  const std::vector<std::string> args = to_args(o);
  const transport::LocalCoordinator coordinator;
  std::vector<std::vector<std::string>> procs, envs;
  for (int r = 0; r < o.ranks; ++r) {
    std::vector<std::string> p = {exe};
    p.insert(p.end(), args.begin(), args.end());
    procs.push_back(p);
    envs.push_back({"MOERL_RANK=" + std::to_string(r),
                    "MOERL_WORLD_SIZE=" + std::to_string(o.ranks),
                    "MOERL_FI_PROVIDER=" + o.provider});
    for (const std::string& e : coordinator.env()) envs.back().push_back(e);
  }
  int rc = 0;
  std::string ours = capture(procs, envs, rc);
  if (rc != 0 || ours.empty()) {
    std::fprintf(stderr, "ep_bench: a rank failed (exit %d)\n", rc);
    return rc != 0 ? rc : 1;
  }
  while (!ours.empty() && (ours.back() == '\n' || ours.back() == '}')) ours.pop_back();

  std::string mpi;
#ifdef MOERL_EP_BENCH_MPIEXEC
  if (o.mpi) {
    std::vector<std::string> p = {MOERL_EP_BENCH_MPIEXEC, "-np", std::to_string(o.ranks),
                                  "--oversubscribe", "--bind-to", "none"};
    if (geteuid() == 0) p.push_back("--allow-run-as-root");
    // Same kind of path as ours: shared memory for shm, TCP (over loopback here) for tcp/efa.
    const std::vector<std::string> btl =
        o.provider == "shm" ? std::vector<std::string>{"--mca", "btl", "self,vader"}
                            : std::vector<std::string>{"--mca", "btl", "self,tcp"};
    p.insert(p.end(), btl.begin(), btl.end());
    p.push_back(exe.substr(0, exe.rfind('/') + 1) + "ep_bench_mpi");
    p.insert(p.end(), args.begin(), args.end());
    int mrc = 0;
    mpi = capture({p}, {{}}, mrc);
    if (mrc != 0 || mpi.find('{') == std::string::npos) {
      std::fprintf(stderr, "ep_bench: the MPI baseline failed (exit %d); reporting without it\n",
                   mrc);
      mpi.clear();
    } else {
      mpi = mpi.substr(mpi.find('{') + 1);
      while (!mpi.empty() && (mpi.back() == '\n' || mpi.back() == '}')) mpi.pop_back();
    }
  }
#endif
  std::ostringstream extra;
  extra.precision(3);
  extra << std::fixed;
  const double d = json_number(ours, "dispatch_gbps"), c = json_number(ours, "combine_gbps"),
               m = json_number(ours, "memcpy_gbps");
  extra << ", \"host_cores\": " << std::thread::hardware_concurrency()
        << ", \"dispatch_vs_memcpy\": " << d / m << ", \"combine_vs_memcpy\": " << c / m;
  if (!mpi.empty()) {
    const std::string mj = "{" + mpi + "}";
    extra << ", " << mpi << ", \"dispatch_vs_mpi\": " << d / json_number(mj, "mpi_dispatch_gbps")
          << ", \"combine_vs_mpi\": " << c / json_number(mj, "mpi_combine_gbps");
  } else {
    extra << ", \"mpi_dispatch_gbps\": null, \"mpi_combine_gbps\": null";
  }
  const std::string js = ours + extra.str() + "}";
  if (o.json) {
    std::printf("%s\n", js.c_str());
    return 0;
  }
  std::printf("ep_bench: %d ranks over %s, T=%lld C=%lld E=%d K=%d %s, %s routing\n", o.ranks,
              o.provider.c_str(), (long long)o.tokens, (long long)o.hidden, o.experts, o.topk,
              o.dtype.c_str(), o.routing.c_str());
  std::printf("  %-10s %10s %10s\n", "", "GB/s", "us");
  std::printf("  %-10s %10.2f %10.1f\n", "dispatch", d, json_number(js, "dispatch_us"));
  std::printf("  %-10s %10.2f %10.1f\n", "combine", c, json_number(js, "combine_us"));
  std::printf("  %-10s %10.2f %10.1f\n", "memcpy", m, json_number(js, "memcpy_us"));
  if (!mpi.empty()) {
    std::printf("  %-10s %10.2f %10.1f\n", "mpi disp.", json_number(js, "mpi_dispatch_gbps"),
                json_number(js, "mpi_dispatch_us"));
    std::printf("  %-10s %10.2f %10.1f\n", "mpi comb.", json_number(js, "mpi_combine_gbps"),
                json_number(js, "mpi_combine_us"));
  }
  return 0;
}

}  // namespace
}  // namespace moerl::bench

int main(int argc, char** argv) {
  using namespace moerl;
  bench::Options o;
  if (!bench::parse_options(argc, argv, o)) return o.help ? 0 : 2;
  try {
    if (std::getenv("MOERL_RANK") == nullptr) return bench::launch(o);
    const std::string report = bench::run_rank(o, transport::Config::from_env());
    if (!report.empty()) std::printf("%s\n", report.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "ep_bench: %s\n", e.what());
    return e.kind() == ErrorKind::BadInput ? 2 : 1;
  }
}
