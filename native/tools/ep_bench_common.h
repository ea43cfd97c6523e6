// Shared by ep_bench (our dispatch/combine) and ep_bench_mpi (the MPI_Alltoallv baseline):
// command-line options, the synthetic routing, and the statistics, so both sides measure
// exactly the same workload the same way.
//
// Timing: per iteration every rank measures its own time between a barrier and the end of
// the operation; the iteration's time is the maximum over ranks; the figure is the median
// over iterations. Bytes are counted as DeepEP does: rows received by a rank (each token
// once per destination rank) x hidden x bytes per element, averaged over ranks.
#pragma once

#include <algorithm>  // std::sort, std::find, std::max
#include <cstdint>
#include <cstdio>
#include <cstdlib>    // std::atoi, std::atoll
#include <cstring>    // std::strcmp
#include <string>
#include <vector>

#include "ep/dtype.h"
#include "ep/ep.h"

namespace moerl::bench {

struct Options {
  int ranks = 2;
  std::string provider = "shm";
  int64_t tokens = 4096;
  int64_t hidden = 2048;
  int experts = 16;
  int topk = 4;
  std::string dtype = "bf16";     // fp32 | bf16 | fp8 (fp8 for dispatch; combine then uses bf16)
  std::string routing = "uniform";  // uniform | skewed (80% of slots to experts 0 and 1)
  int warmup = 3;
  int iters = 20;
  uint64_t seed = 1;
  bool json = false;
  bool mpi = true;  // also run the MPI_Alltoallv baseline (launcher mode only)
  bool help = false;
};

// Parses --key value pairs; returns false (after printing why) on anything unknown.
inline bool parse_options(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ep_bench: %s needs a value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") {
      std::fprintf(stderr,
                   "usage: ep_bench [--ranks N] [--provider shm|tcp|efa] [--tokens T] [--hidden C]\n"
                   "                [--experts E] [--topk K] [--dtype fp32|bf16|fp8]\n"
                   "                [--routing uniform|skewed] [--warmup W] [--iters I] [--seed S]\n"
                   "                [--json] [--no-mpi]\n"
                   "Without MOERL_RANK set, spawns N ranks on this host and runs the MPI baseline;\n"
                   "with it, runs as one rank of a group (rank env contract, docs/native-ep.md).\n");
      o.help = true;
      return false;
    }
    if (a == "--json") o.json = true;
    else if (a == "--no-mpi") o.mpi = false;
    else if (a == "--ranks" && (v = value("--ranks"))) o.ranks = std::atoi(v);
    else if (a == "--provider" && (v = value("--provider"))) o.provider = v;
    else if (a == "--tokens" && (v = value("--tokens"))) o.tokens = std::atoll(v);
    else if (a == "--hidden" && (v = value("--hidden"))) o.hidden = std::atoll(v);
    else if (a == "--experts" && (v = value("--experts"))) o.experts = std::atoi(v);
    else if (a == "--topk" && (v = value("--topk"))) o.topk = std::atoi(v);
    else if (a == "--dtype" && (v = value("--dtype"))) o.dtype = v;
    else if (a == "--routing" && (v = value("--routing"))) o.routing = v;
    else if (a == "--warmup" && (v = value("--warmup"))) o.warmup = std::atoi(v);
    else if (a == "--iters" && (v = value("--iters"))) o.iters = std::atoi(v);
    else if (a == "--seed" && (v = value("--seed"))) o.seed = uint64_t(std::atoll(v));
    else {
      std::fprintf(stderr, "ep_bench: unknown or incomplete option '%s'\n", a.c_str());
      return false;
    }
  }
  const bool ok = o.ranks >= 1 && o.tokens >= 0 && o.hidden > 0 && o.experts > 0 &&
                  o.experts % o.ranks == 0 && o.topk > 0 && o.topk <= o.experts &&
                  o.iters > 0 && o.warmup >= 0 &&
                  (o.dtype == "fp32" || o.dtype == "bf16" || o.dtype == "fp8") &&
                  (o.routing == "uniform" || o.routing == "skewed") &&
                  (o.dtype != "fp8" || o.hidden % 128 == 0);
  if (!ok) std::fprintf(stderr, "ep_bench: inconsistent options (experts must divide by ranks, "
                                "dtype fp32|bf16|fp8, routing uniform|skewed, fp8 needs hidden %% 128 == 0)\n");
  return ok;
}

// Argument list that reproduces these options (for spawned ranks / mpirun).
inline std::vector<std::string> to_args(const Options& o) {
  return {"--ranks", std::to_string(o.ranks), "--provider", o.provider, "--tokens",
          std::to_string(o.tokens), "--hidden", std::to_string(o.hidden), "--experts",
          std::to_string(o.experts), "--topk", std::to_string(o.topk), "--dtype", o.dtype,
          "--routing", o.routing, "--warmup", std::to_string(o.warmup), "--iters",
          std::to_string(o.iters), "--seed", std::to_string(o.seed)};
}

inline ep::DType payload_dtype(const Options& o) {
  if (o.dtype == "fp32") return ep::DType::F32;
  return o.dtype == "bf16" ? ep::DType::BF16 : ep::DType::F8E4M3;
}
// combine moves fp32 for fp32 runs, bf16 otherwise (FP8 is a dispatch-only format).
inline ep::DType combine_dtype(const Options& o) {
  return o.dtype == "fp32" ? ep::DType::F32 : ep::DType::BF16;
}

struct Routing {
  std::vector<ep::topk_idx_t> topk_idx;  // [T, K]
  std::vector<float> topk_weights;       // [T, K]
};

inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// K distinct experts per token. uniform: all experts equally likely. skewed: each slot picks
// one of the two hot experts (0 and 1) with probability 0.8 while one is still free.
inline Routing make_routing(const Options& o, int rank) {
  Routing r;
  const int64_t T = o.tokens;
  const int K = o.topk, E = o.experts;
  r.topk_idx.resize(size_t(T * K));
  r.topk_weights.resize(size_t(T * K));
  uint64_t state = o.seed * 0x9e3779b97f4a7c15ull + uint64_t(rank) * 1315423911ull;
  auto next = [&] { return mix(state += 0x9e3779b97f4a7c15ull); };
  for (int64_t t = 0; t < T; ++t) {
    ep::topk_idx_t* row = r.topk_idx.data() + t * K;
    for (int k = 0; k < K; ++k) {
      ep::topk_idx_t e;
      const bool hot = o.routing == "skewed" && double(next() >> 11) * 0x1.0p-53 < 0.8;
      do {
        e = hot && (std::find(row, row + k, 0) == row + k || std::find(row, row + k, 1) == row + k)
                ? ep::topk_idx_t(next() % 2)
                : ep::topk_idx_t(next() % uint64_t(E));
      } while (std::find(row, row + k, e) != row + k);
      row[k] = e;
      r.topk_weights[size_t(t * K + k)] = 1.0f / float(K);
    }
  }
  return r;
}

// x [T, C] random payload in the options' dtype (bytes), plus fp8 scales when needed.
inline void make_payload(const Options& o, int rank, ep::HostBytes& x,
                         std::vector<float>& scales) {
  const int64_t T = o.tokens, C = o.hidden;
  std::vector<float> f(size_t(T * C));
  uint64_t state = o.seed * 7 + uint64_t(rank) * 31 + 5;
  for (auto& v : f) v = float(double(mix(state += 0x9e3779b97f4a7c15ull) >> 11) * 0x1.0p-52 - 1.0);
  const ep::DType dt = payload_dtype(o);
  x.resize(size_t(T * C) * ep::dtype_bytes(dt));
  if (dt == ep::DType::F32) {
    std::memcpy(x.data(), f.data(), x.size());
  } else if (dt == ep::DType::BF16) {
    auto* p = reinterpret_cast<uint16_t*>(x.data());
    for (size_t i = 0; i < f.size(); ++i) p[i] = ep::f32_to_bf16(f[i]);
  } else {
    scales.resize(size_t(T * (C / 128)));
    ep::quantize_fp8(f.data(), T, C, x.data(), scales.data());
  }
}

// Rows this rank sends to each destination (each token once per destination rank).
inline int64_t unique_rows_to(const Routing& r, const Options& o, int dest) {
  const int L = o.experts / o.ranks, K = o.topk;
  int64_t n = 0;
  for (int64_t t = 0; t < o.tokens; ++t) {
    bool hit = false;
    for (int k = 0; k < K; ++k) hit = hit || r.topk_idx[size_t(t * K + k)] / L == dest;
    n += hit;
  }
  return n;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// times [R, iters] (every rank's own time per iteration) -> median over iterations of the
// maximum over ranks.
inline double median_of_max(const std::vector<double>& times, int ranks, int iters) {
  std::vector<double> per_iter(size_t(iters), 0.0);
  for (int r = 0; r < ranks; ++r)
    for (int i = 0; i < iters; ++i)
      per_iter[size_t(i)] = std::max(per_iter[size_t(i)], times[size_t(r * iters + i)]);
  return median(per_iter);
}

}  // namespace moerl::bench
