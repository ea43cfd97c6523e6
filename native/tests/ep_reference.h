// Test inputs and the single-process reference for EP dispatch/combine.
//
// Every rank can regenerate every rank's inputs from (seed, rank), so each rank of a
// multi-process test computes the whole group's expected outputs with plain loops over
// (source rank, token, slot) — no layout, handle or staging code shared with ep/ — and
// compares its own outputs bit for bit.
#pragma once

#include <algorithm>  // std::find
#include <cstring>    // std::memcpy
#include <cstdint>
#include <string>
#include <vector>

#include "ep/dtype.h"
#include "ep/ep.h"

namespace moerl::ep::testing {

// splitmix64: tiny, seedable, identical everywhere.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  int below(int n) { return int(next() % uint64_t(n)); }
};

struct Case {
  int world_size = 1;
  int num_experts = 8;
  int num_topk = 2;
  int64_t hidden = 128;
  int64_t tokens = 64;
  std::string token_rule = "fixed";  // fixed | varied (T + 13 r) | zero (rank 1 has none)
  std::string routing = "random";    // random | minus1 | one_expert | skewed
  DType dtype = DType::F32;
  uint64_t seed = 1;
};

struct RankInputs {
  int64_t num_tokens = 0;
  std::vector<float> x_f32;           // [T, C] the values before any rounding
  std::vector<uint8_t> x;             // [T, C] payload in the case's dtype
  std::vector<float> x_scales;        // [T, C/128] fp8 only
  std::vector<topk_idx_t> topk_idx;   // [T, K]
  std::vector<float> topk_weights;    // [T, K]
};

inline int64_t tokens_of(const Case& c, int rank) {
  if (c.token_rule == "varied") return c.tokens + 13 * rank;
  if (c.token_rule == "zero") return rank == (c.world_size > 1 ? 1 : 0) ? 0 : c.tokens;
  return c.tokens;
}

inline RankInputs make_inputs(const Case& c, int rank) {
  RankInputs in;
  const int64_t T = in.num_tokens = tokens_of(c, rank), C = c.hidden;
  const int K = c.num_topk, E = c.num_experts;
  Rng rng(c.seed * 1000003ull + uint64_t(rank) * 7919ull + 17);
  in.x_f32.resize(size_t(T * C));
  for (auto& v : in.x_f32) v = float(rng.uniform() * 4.0 - 2.0);
  in.topk_idx.assign(size_t(T * K), -1);
  in.topk_weights.resize(size_t(T * K));
  for (int64_t t = 0; t < T; ++t) {
    topk_idx_t* row = in.topk_idx.data() + t * K;
    for (int k = 0; k < K; ++k) {
      in.topk_weights[size_t(t * K + k)] = float(rng.uniform());
      if (c.routing == "one_expert") {
        row[k] = k == 0 ? E - 1 : -1;
        continue;
      }
      topk_idx_t e;
      do {
        const bool hot = c.routing == "skewed" && rng.uniform() < 0.8;
        e = hot ? rng.below(2) : rng.below(E);
      } while (std::find(row, row + k, e) != row + k && K <= E);
      row[k] = e;
      if (c.routing == "minus1" && rng.uniform() < 0.3) row[k] = -1;
    }
  }
  const size_t n = size_t(T * C);
  if (c.dtype == DType::F32) {
    in.x.resize(n * 4);
    if (n > 0) std::memcpy(in.x.data(), in.x_f32.data(), n * 4);
  } else if (c.dtype == DType::BF16) {
    in.x.resize(n * 2);
    auto* p = reinterpret_cast<uint16_t*>(in.x.data());
    for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(in.x_f32[i]);
  } else {
    in.x.resize(n);
    in.x_scales.resize(size_t(T * (C / 128)));
    quantize_fp8(in.x_f32.data(), T, C, in.x.data(), in.x_scales.data());
  }
  return in;
}

// The "expert computation" whose outputs combine sums: row * (1 + d/4) on rank d, in fp32,
// rounded to the payload dtype (fp32 or bf16).
inline float expert_scale(int dest_rank) { return 1.0f + 0.25f * float(dest_rank); }

struct Expected {
  std::vector<int> src_rank;             // [N]
  std::vector<int64_t> src_token;        // [N]
  std::vector<topk_idx_t> recv_topk_idx; // [N, K] local ids
  std::vector<int64_t> num_recv_tokens_per_expert;  // [L]
};

// What rank `dest` must receive, in (source rank, source token) order.
inline Expected expected_dispatch(const Case& c, const std::vector<RankInputs>& all, int dest) {
  Expected ex;
  const int L = c.num_experts / c.world_size, K = c.num_topk;
  ex.num_recv_tokens_per_expert.assign(size_t(L), 0);
  for (int s = 0; s < c.world_size; ++s) {
    for (int64_t t = 0; t < all[size_t(s)].num_tokens; ++t) {
      bool mine = false;
      std::vector<topk_idx_t> local(size_t(K), -1);
      for (int k = 0; k < K; ++k) {
        const topk_idx_t e = all[size_t(s)].topk_idx[size_t(t * K + k)];
        if (e >= 0 && e / L == dest) {
          mine = true;
          local[size_t(k)] = e - topk_idx_t(dest) * L;
          ++ex.num_recv_tokens_per_expert[size_t(local[size_t(k)])];
        }
      }
      if (!mine) continue;
      ex.src_rank.push_back(s);
      ex.src_token.push_back(t);
      ex.recv_topk_idx.insert(ex.recv_topk_idx.end(), local.begin(), local.end());
    }
  }
  return ex;
}

// Reference combine at `source` of rows scaled per destination: [T, C] fp32 values (before
// the final rounding to bf16), summed in destination order 0..R-1 starting from the first
// contribution.
inline std::vector<float> expected_combine(const Case& c, const RankInputs& in, int source) {
  (void)source;
  const int L = c.num_experts / c.world_size, K = c.num_topk;
  const int64_t C = c.hidden;
  std::vector<float> out(size_t(in.num_tokens * C), 0.0f);
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    bool first = true;
    for (int d = 0; d < c.world_size; ++d) {
      bool to_d = false;
      for (int k = 0; k < K; ++k) {
        const topk_idx_t e = in.topk_idx[size_t(t * K + k)];
        to_d = to_d || (e >= 0 && e / L == d);
      }
      if (!to_d) continue;
      for (int64_t ch = 0; ch < C; ++ch) {
        // The destination's output row: payload value (as received) times the scale,
        // rounded to the payload dtype, exactly as the test's expert step computes it.
        float v;
        if (c.dtype == DType::BF16) {
          const float xv = bf16_to_f32(reinterpret_cast<const uint16_t*>(in.x.data())[t * C + ch]);
          v = bf16_to_f32(f32_to_bf16(xv * expert_scale(d)));
        } else {
          v = in.x_f32[size_t(t * C + ch)] * expert_scale(d);
        }
        float& o = out[size_t(t * C + ch)];
        o = first ? v : o + v;
      }
      first = false;
    }
  }
  return out;
}

}  // namespace moerl::ep::testing
