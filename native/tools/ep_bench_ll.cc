// ep_bench_ll: latency of the low-latency EP mode (ep/low_latency.h) at a decode shape
// (default DeepSeek-V3: 128 tokens per rank, hidden 7168, 256 experts, top-8), next to the
// physical limit measured in the same run: the bytes each rank moves divided by this
// machine's memcpy bandwidth (all ranks copying at once, as they run).
//
//   ep_bench_ll --ranks 2 --provider shm --dtype bf16|fp8 [--tokens 128] [--hidden 7168]
//               [--experts 256] [--topk 8] [--slot-capacity P] [--iters 50] [--warmup 5]
//
// Without MOERL_RANK it spawns --ranks copies of itself on this host (loopback coordinator);
// rank 0 prints one JSON line. Bytes moved per rank: every (token, top-k slot) pair's row
// once per direction (dispatch: payload + fp8 scales; combine: bf16 rows), the counting
// DeepEP's low-latency figures use. Times: per iteration the maximum over ranks, median
// over iterations.
#include <spawn.h>       // posix_spawn
#include <sys/wait.h>    // waitpid
#include <time.h>        // clock_gettime: per-thread CPU time
#include <unistd.h>      // readlink, close

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>  // std::thread::hardware_concurrency
#include <vector>

#include "common/check.h"
#include "ep/low_latency.h"
#include "ep_bench_common.h"  // Options parsing pieces, routing, payload, median_of_max
#include "transport/clock.h"
#include "transport/communicator.h"
#include "transport/local_coordinator.h"

extern char** environ;

namespace moerl::bench {
namespace {

struct LlOptions {
  int ranks = 2;
  std::string provider = "shm";
  int64_t tokens = 128, hidden = 7168;
  int experts = 256, topk = 8, slot_capacity = 0, warmup = 5, iters = 50;
  std::string dtype = "bf16";  // dispatch payload: bf16 | fp8 (combine is bf16 either way)
};

bool parse(int argc, char** argv, LlOptions& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fprintf(stderr, "usage: ep_bench_ll [--ranks N] [--provider shm|tcp|efa] "
                           "[--dtype bf16|fp8] [--tokens T] [--hidden C] [--experts E]\n"
                           "                   [--topk K] [--slot-capacity P] [--iters I] "
                           "[--warmup W]\nPrints one JSON line (rank 0).\n");
      return false;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ep_bench_ll: unknown option or missing value: %s\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    if (a == "--ranks") o.ranks = std::atoi(v);
    else if (a == "--provider") o.provider = v;
    else if (a == "--tokens") o.tokens = std::atoll(v);
    else if (a == "--hidden") o.hidden = std::atoll(v);
    else if (a == "--experts") o.experts = std::atoi(v);
    else if (a == "--topk") o.topk = std::atoi(v);
    else if (a == "--slot-capacity") o.slot_capacity = std::atoi(v);
    else if (a == "--warmup") o.warmup = std::atoi(v);
    else if (a == "--iters") o.iters = std::atoi(v);
    else if (a == "--dtype") o.dtype = v;
    else {
      std::fprintf(stderr, "ep_bench_ll: unknown option %s (see the file's header)\n", a.c_str());
      return false;
    }
  }
  const bool ok = o.ranks >= 1 && o.tokens > 0 && o.experts % o.ranks == 0 && o.topk > 0 &&
                  o.topk <= o.experts && o.iters > 0 && o.warmup >= 0 &&
                  (o.dtype == "bf16" || o.dtype == "fp8");
  if (!ok) std::fprintf(stderr, "ep_bench_ll: inconsistent options (experts must divide by "
                                "ranks, topk <= experts, dtype bf16|fp8)\n");
  return ok;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one;
  f >> one;
  return one.empty() ? "null" : one;
}

void run_rank(const LlOptions& o, const transport::Config& config) {
  transport::Communicator comm(config);
  const int R = comm.world_size(), self = comm.rank();
  const bool fp8 = o.dtype == "fp8";
  ep::LowLatencyConfig lc;
  lc.num_max_dispatch_tokens_per_rank = int(o.tokens);
  lc.hidden = int(o.hidden);
  lc.num_experts = o.experts;
  lc.num_topk = o.topk;
  lc.dispatch_dtype = fp8 ? ep::DType::F8E4M3 : ep::DType::BF16;
  lc.num_max_tokens_per_slot = o.slot_capacity;
  ep::LowLatencyBuffer buffer(comm, lc);

  // Routing and bf16 input from ep_bench's generators (uniform, K distinct experts).
  Options base;
  base.ranks = R;
  base.tokens = o.tokens;
  base.hidden = o.hidden;
  base.experts = o.experts;
  base.topk = o.topk;
  base.dtype = "bf16";
  const Routing routing = make_routing(base, self);
  ep::HostBytes x;
  std::vector<float> no_scales;
  make_payload(base, self, x, no_scales);
  const ep::TensorView xv{x.data(), ep::DType::BF16, o.tokens, o.hidden};

  const int64_t slot_rows = int64_t(buffer.num_local_experts()) * R * buffer.slot_capacity();
  ep::LowLatencyRecv recv;
  ep::Tensor y_fp8, out;  // combine input for fp8 runs (bf16 expert outputs)
  if (fp8) y_fp8.resize(ep::DType::BF16, slot_rows, o.hidden);
  auto y_view = [&]() -> ep::TensorView {
    return fp8 ? y_fp8.view() : ep::TensorView{recv.recv_x, ep::DType::BF16, slot_rows, o.hidden};
  };
  int64_t pairs = 0;
  for (const ep::topk_idx_t e : routing.topk_idx) pairs += e >= 0;
  const size_t dispatch_bytes =
      size_t(pairs) * (size_t(o.hidden) * (fp8 ? 1 : 2) + (fp8 ? size_t(o.hidden / 128) * 4 : 0));
  const size_t combine_bytes = size_t(pairs) * size_t(o.hidden) * 2;
  ep::HostBytes copy_src(std::max(dispatch_bytes, combine_bytes), 1), copy_dst(copy_src.size(), 0);

  const int I = o.iters;
  // Wall time, and this thread's CPU time (user + kernel, which includes the shm copies the
  // receiver performs): on a loaded host the difference is time spent waiting for a core.
  std::vector<float> t_d(size_t(R * I), 0.0f), t_c(t_d.size(), 0.0f), t_md(t_d.size(), 0.0f),
      t_mc(t_d.size(), 0.0f), cpu_d(t_d.size(), 0.0f), cpu_c(t_d.size(), 0.0f),
      cpu_md(t_d.size(), 0.0f), cpu_mc(t_d.size(), 0.0f);
  for (int i = -o.warmup; i < I; ++i) {
    const size_t at = size_t(self * I + (i < 0 ? 0 : i));
    comm.barrier();
    double t0 = transport::now_s(), c0 = thread_cpu_s();
    buffer.dispatch(xv, routing.topk_idx.data(), recv);
    const double td = transport::now_s() - t0, cd = thread_cpu_s() - c0;
    comm.barrier();
    t0 = transport::now_s(), c0 = thread_cpu_s();
    buffer.combine(y_view(), routing.topk_weights.data(), out);
    const double tc = transport::now_s() - t0, cc = thread_cpu_s() - c0;
    comm.barrier();
    t0 = transport::now_s(), c0 = thread_cpu_s();
    std::memcpy(copy_dst.data(), copy_src.data(), dispatch_bytes);
    const double tmd = transport::now_s() - t0, cmd = thread_cpu_s() - c0;
    comm.barrier();
    t0 = transport::now_s(), c0 = thread_cpu_s();
    std::memcpy(copy_dst.data(), copy_src.data(), combine_bytes);
    const double tmc = transport::now_s() - t0, cmc = thread_cpu_s() - c0;
    if (i < 0) continue;
    t_d[at] = float(td), t_c[at] = float(tc), t_md[at] = float(tmd), t_mc[at] = float(tmc);
    cpu_d[at] = float(cd), cpu_c[at] = float(cc), cpu_md[at] = float(cmd), cpu_mc[at] = float(cmc);
  }
  for (auto* v : {&t_d, &t_c, &t_md, &t_mc, &cpu_d, &cpu_c, &cpu_md, &cpu_mc})
    comm.allreduce_sum(v->data(), v->size());
  float bytes[2] = {float(dispatch_bytes), float(combine_bytes)};
  comm.allreduce_sum(bytes, 2);
  if (self != 0) return;
  auto med = [&](const std::vector<float>& v) {
    return median_of_max(std::vector<double>(v.begin(), v.end()), R, I) * 1e6;
  };
  const double d = med(t_d), c = med(t_c), md = med(t_md), mc = med(t_mc);
  std::ostringstream js;
  js.precision(1);
  js << std::fixed << "{\"bench\": \"ep_ll\", \"ranks\": " << R << ", \"provider\": \""
     << comm.config().provider << "\", \"fi_provider\": \"" << comm.provider_name()
     << "\", \"path\": \"" << buffer.transport_path() << "\", \"dispatch_messages\": \""
     << (buffer.dispatch_packed() ? "per_peer" : "per_slot") << "\", \"tokens\": " << o.tokens
     << ", \"hidden\": " << o.hidden << ", \"experts\": " << o.experts << ", \"topk\": " << o.topk
     << ", \"dispatch_dtype\": \"" << o.dtype << "\", \"combine_dtype\": \"bf16\""
     << ", \"slot_capacity\": " << buffer.slot_capacity() << ", \"iters\": " << I
     << ", \"dispatch_bytes_per_rank\": " << bytes[0] / R
     << ", \"combine_bytes_per_rank\": " << bytes[1] / R << ", \"dispatch_us\": " << d
     << ", \"combine_us\": " << c << ", \"dispatch_cpu_us\": " << med(cpu_d)
     << ", \"combine_cpu_us\": " << med(cpu_c) << ", \"memcpy_dispatch_bytes_us\": " << md
     << ", \"memcpy_combine_bytes_us\": " << mc;
  js.precision(2);
  js << ", \"memcpy_gbps\": " << bytes[0] / R / md / 1e3 << ", \"dispatch_vs_limit\": " << d / md
     << ", \"combine_vs_limit\": " << c / mc << ", \"memcpy_dispatch_bytes_cpu_us\": "
     << med(cpu_md) << ", \"memcpy_combine_bytes_cpu_us\": " << med(cpu_mc)
     << ", \"dispatch_cpu_vs_memcpy_cpu\": " << med(cpu_d) / med(cpu_md)
     << ", \"combine_cpu_vs_memcpy_cpu\": " << med(cpu_c) / med(cpu_mc) << ", \"host_cores\": "
     << std::thread::hardware_concurrency() << ", \"load_1min\": " << load_average()
     << ", \"deepep_ll_h800_ep8_us\": {\"dispatch\": 77, \"combine\": 114}}";
  std::printf("%s\n", js.str().c_str());
}

int launch(const LlOptions& o, int argc, char** argv) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  MOERL_CHECK(n > 0, "cannot find this executable's path");
  exe[n] = 0;
  const transport::LocalCoordinator coordinator;
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    std::vector<std::string> env = {"MOERL_RANK=" + std::to_string(r),
                                    "MOERL_WORLD_SIZE=" + std::to_string(o.ranks),
                                    "MOERL_FI_PROVIDER=" + o.provider};
    for (const std::string& e : coordinator.env()) env.push_back(e);
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    std::vector<char*> envp, args = {exe};
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, exe, nullptr, nullptr, args.data(), envp.data());
    MOERL_CHECK(rc == 0, "cannot start rank ", r, ": ", std::strerror(rc));
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  if (failed) std::fprintf(stderr, "ep_bench_ll: a rank failed\n");
  return failed;
}

}  // namespace
}  // namespace moerl::bench

int main(int argc, char** argv) {
  using namespace moerl;
  bench::LlOptions o;
  if (!bench::parse(argc, argv, o)) return 2;
  try {
    if (std::getenv("MOERL_RANK") == nullptr) return bench::launch(o, argc, argv);
    bench::run_rank(o, transport::Config::from_env());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "ep_bench_ll: %s\n", e.what());
    return e.kind() == ErrorKind::BadInput ? 2 : 1;
  }
}
