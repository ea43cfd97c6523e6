// Low-latency mode (ep/low_latency.h): slots and combine bitwise against the single-process
// reference for 1/2/4 ranks over shm and tcp, both dispatch schemes (packed per peer, per
// slot), two overlapped micro-batches, slot overflow as a clear error on every rank, a killed
// peer named within the deadline; in process, the fast fp8 encoder against dtype.h's and the
// bad-input errors.
#include <fcntl.h>  // O_* for ep_spawn.h

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "ep/dtype.h"
#include "ep/low_latency.h"
#include "ep/low_latency_detail.h"
#include "ep_reference.h"
#include "ep_spawn.h"

namespace moerl::ep::testing {
namespace {

struct LlCase {
  int world;
  const char* provider;
  int experts, topk, hidden, tokens;
  const char* token_rule;
  const char* routing;
  const char* dtype;
  int max_tokens, slot_capacity;
  const char* mode;
  const char* dispatch = nullptr;  // the scheme the case must take ("per slot"), or any
};

void PrintTo(const LlCase& c, std::ostream* os) {
  *os << c.world << " ranks over " << c.provider << ", E=" << c.experts << " K=" << c.topk
      << " C=" << c.hidden << " T=" << c.tokens << " " << c.token_rule << " " << c.routing << " "
      << c.dtype << " T_max=" << c.max_tokens << " P=" << c.slot_capacity << " " << c.mode;
}

std::vector<std::string> args_of(const LlCase& c) {
  return {MOERL_EP_LL_TEST_RANK, "ll", std::to_string(c.experts), std::to_string(c.topk),
          std::to_string(c.hidden), std::to_string(c.tokens), c.token_rule, c.routing, c.dtype,
          "11", std::to_string(c.max_tokens), std::to_string(c.slot_capacity), c.mode};
}

std::string name_of(const ::testing::TestParamInfo<LlCase>& info) {
  const LlCase& c = info.param;
  return std::string(c.provider) + "_r" + std::to_string(c.world) + "_" + c.routing + "_" +
         c.token_rule + "_" + c.dtype + "_" + c.mode + (c.dispatch ? "_per_slot" : "");
}

class EpLowLatency : public ::testing::TestWithParam<LlCase> {};

TEST_P(EpLowLatency, MatchesReferenceBitwise) {
  const LlCase& c = GetParam();
  const auto results = run_ranks(c.world, c.provider, 20, args_of(c));
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  if (c.dispatch) {
    EXPECT_NE(results[0].stderr_text.find(std::string("low-latency path: tagged, dispatch ") +
                                          c.dispatch),
              std::string::npos)
        << describe(results);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EpLowLatency,
    ::testing::Values(
        LlCase{1, "shm", 8, 2, 128, 50, "fixed", "random", "bf16", 64, 0, "plain"},
        LlCase{1, "shm", 8, 3, 256, 40, "fixed", "minus1", "fp8", 40, 0, "overlap"},
        LlCase{2, "shm", 8, 3, 128, 100, "fixed", "random", "f32", 128, 0, "plain"},
        LlCase{2, "shm", 8, 3, 256, 100, "fixed", "random", "bf16", 128, 0, "overlap"},
        LlCase{2, "shm", 8, 2, 256, 60, "varied", "minus1", "fp8", 80, 0, "plain"},
        LlCase{2, "shm", 8, 2, 64, 80, "zero", "skewed", "bf16", 80, 0, "plain"},
        LlCase{2, "shm", 8, 2, 64, 80, "fixed", "one_expert", "f32", 80, 0, "plain"},
        LlCase{4, "shm", 16, 4, 128, 90, "varied", "random", "bf16", 130, 0, "overlap"},
        LlCase{4, "shm", 16, 4, 128, 70, "fixed", "skewed", "fp8", 70, 0, "plain"},
        LlCase{4, "shm", 8, 2, 64, 70, "zero", "minus1", "f32", 70, 64, "plain"},
        // Experts above 256 per rank: combine's expert index spills into a second tag
        // operation (dispatch packs here; the last case below spills it per slot).
        LlCase{2, "shm", 600, 8, 128, 64, "fixed", "random", "bf16", 64, 8, "plain"},
        LlCase{2, "tcp", 8, 2, 128, 80, "varied", "random", "bf16", 100, 0, "overlap"},
        LlCase{4, "tcp", 16, 4, 128, 60, "zero", "minus1", "fp8", 60, 0, "plain"},
        // The per-slot dispatch (one message per (peer, local expert) + a signal carrying the
        // counts and fp8 scales) at small shapes; all cases above but 2 pack per peer. Each
        // slot message averages T_max*K/E = 128 rows: 64 KiB (f32, hidden 128), 32 KiB (bf16
        // hidden 128, fp8 hidden 256), above the 16 KiB up to which dispatch packs. Rank 0
        // reports the scheme its buffer took: these fail if a threshold change packs them.
        LlCase{2, "shm", 8, 8, 128, 128, "fixed", "random", "f32", 128, 0, "plain", "per slot"},
        LlCase{2, "tcp", 8, 8, 128, 128, "fixed", "random", "f32", 128, 0, "plain", "per slot"},
        LlCase{2, "shm", 8, 8, 128, 100, "varied", "minus1", "bf16", 128, 0, "overlap",
               "per slot"},
        LlCase{2, "tcp", 8, 8, 128, 128, "fixed", "random", "bf16", 128, 0, "plain", "per slot"},
        LlCase{2, "shm", 8, 8, 256, 128, "fixed", "random", "fp8", 128, 0, "overlap", "per slot"},
        LlCase{2, "tcp", 8, 8, 256, 100, "varied", "minus1", "fp8", 128, 0, "plain",
               "per slot"},
        // 300 local experts: 256*8/600 rows x 5 KiB = 17 KiB per slot message (T_max 256, P 8).
        LlCase{2, "shm", 600, 8, 2560, 64, "varied", "random", "bf16", 256, 8, "plain",
               "per slot"}),
    name_of);

// A slot capacity of 3 under skewed routing (80 % of pairs to experts 0 and 1) overflows:
// every rank, not only the two involved, throws the same BadInput naming the expert, the
// ranks and the capacity, and the group is still usable (the ranks then pass a barrier).
TEST(EpLowLatencyOverflow, IsAClearErrorOnEveryRank) {
  for (const char* provider : {"shm", "tcp"}) {
    const LlCase c{3, provider, 6, 2, 128, 40, "fixed", "skewed", "bf16", 40, 3, "plain"};
    const auto results = run_ranks(c.world, c.provider, 20, args_of(c));
    for (const auto& r : results) {
      ASSERT_EQ(r.exit_code, 2) << describe(results);
      EXPECT_NE(r.stderr_text.find("rank 0 routes"), std::string::npos) << describe(results);
      EXPECT_NE(r.stderr_text.find("to expert 0 (local expert 0 of rank 0), above the slot "
                                   "capacity of 3 tokens"),
                std::string::npos)
          << describe(results);
    }
  }
}

// A rank SIGKILLed while the group loops over low-latency dispatch + combine: every other
// rank exits non-zero well within the deadline, naming the dead rank. The deadline is 10 s
// so that start-up on a loaded host cannot hit it; the failure detector (the dead rank's
// bootstrap connection) has to stop the others within 5 s of the kill.
TEST(EpLowLatencyFailure, KilledPeerIsNamedWithinTheDeadline) {
  for (const char* provider : {"shm", "tcp"}) {
    const double timeout_s = 10;
    const int world = 3, victim = 1;
    bool killed = false;
    double ready_at = -1, killed_at = 0;
    const auto results = run_ranks(
        world, provider, timeout_s, {MOERL_EP_LL_TEST_RANK, "loop", "64"}, 60,
        [&](const std::vector<pid_t>& pids, double elapsed, const std::vector<std::string>& errs) {
          if (killed || pids[victim] <= 0) return;
          if (ready_at < 0) {
            for (const auto& path : errs) {
              std::ifstream f(path);
              const std::string text((std::istreambuf_iterator<char>(f)),
                                     std::istreambuf_iterator<char>());
              if (text.find("looping") == std::string::npos) return;
            }
            ready_at = elapsed;
          }
          if (elapsed > ready_at + 0.2) {
            ::kill(pids[victim], SIGKILL);
            killed_at = elapsed;
            killed = true;
          }
        });
    ASSERT_TRUE(killed) << provider << "\n" << describe(results);
    for (int r = 0; r < world; ++r) {
      if (r == victim) continue;
      EXPECT_NE(results[size_t(r)].exit_code, 0) << provider << "\n" << describe(results);
      EXPECT_LT(results[size_t(r)].seconds, killed_at + 5) << describe(results);
      EXPECT_NE(results[size_t(r)].stderr_text.find("rank 1 died"), std::string::npos)
          << provider << "\n" << describe(results);
    }
  }
}

// No allocation per call: after warm-up, dispatch + combine (fp8, split and whole, packed and
// per slot) make no C++ allocation on any rank's calling thread (a global operator new in the rank program; the
// huge-page buffers, which use aligned_alloc, are sized once by the constructor).
TEST(EpLowLatencyMemory, SteadyStateAllocatesNothing) {
  for (const char* provider : {"shm", "tcp"}) {
    const auto results = run_ranks(3, provider, 20, {MOERL_EP_LL_TEST_RANK, "noalloc", "48"});
    for (const auto& r : results)
      ASSERT_EQ(r.exit_code, 0) << provider << "\n" << describe(results);
  }
}

// The vectorizable encoder matches dtype.h's reference on every class of input.
TEST(EpLowLatencyFp8, FastEncoderMatchesReference) {
  Rng rng(5);
  std::vector<float> values = {0.0f, -0.0f, 448.0f, -448.0f, 447.9f, 464.0f, 1e30f, -1e30f,
                               0x1.0p-6f, 0x1.0p-7f, 0x1.0p-9f, 0x1.0p-10f, 0x1.8p-10f, 1e-30f,
                               NAN, -NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 400000; ++i) {
    const float mag = std::ldexp(float(rng.uniform()), rng.below(30) - 16);
    values.push_back(rng.below(2) ? mag : -mag);
  }
  for (uint32_t code = 0; code < 256; ++code) {  // every midpoint between neighbouring codes
    const float a = fp8_e4m3_to_f32(uint8_t(code)), b = fp8_e4m3_to_f32(uint8_t(code + 1));
    if (!std::isnan(a) && !std::isnan(b) && (code & 0x7f) != 0x7e) values.push_back((a + b) / 2);
  }
  for (const float v : values)
    ASSERT_EQ(f32_to_fp8_e4m3_fast(v), f32_to_fp8_e4m3(v)) << "value " << v;
}

// The row quantizer the dispatch uses (AVX2 where the CPU has it) equals quantize_fp8 on rows
// holding every kind of value: zeros, subnormal-range codes, saturation, NaN, infinities.
TEST(EpLowLatencyFp8, RowQuantizerMatchesReference) {
  Rng rng(6);
  const int64_t T = 64, C = 512;
  std::vector<float> x(size_t(T * C));
  const float specials[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1e30f, 1e-30f, 0x1.0p-6f};
  for (size_t i = 0; i < x.size(); ++i) {
    const float mag = std::ldexp(float(rng.uniform()), rng.below(24) - 12);
    x[i] = rng.below(40) == 0 ? specials[rng.below(8)] : (rng.below(2) ? mag : -mag);
  }
  std::fill(x.begin(), x.begin() + 128, 0.0f);  // an all-zero block keeps scale 1
  std::vector<uint8_t> q_ref(x.size()), q(x.size());
  std::vector<float> s_ref(size_t(T * C / 128)), s(s_ref.size());
  quantize_fp8(x.data(), T, C, q_ref.data(), s_ref.data());
  for (int64_t t = 0; t < T; ++t) quantize_fp8_row(&x[size_t(t * C)], C, &q[size_t(t * C)],
                                                   &s[size_t(t * C / 128)]);
  ASSERT_EQ(std::memcmp(s.data(), s_ref.data(), s.size() * 4), 0);
  for (size_t i = 0; i < q.size(); ++i)
    ASSERT_EQ(q[i], q_ref[i]) << "channel " << i << " x " << x[i];
}

// Adversarial rows: channels whose x / scale lies within a few ulps of a rounding midpoint
// between two e4m3 codes (normal and subnormal range), for block maxima from 1e-37 (scale
// subnormal) to 1e38. (A reciprocal multiply instead of the division fails this test.)
TEST(EpLowLatencyFp8, RowQuantizerMatchesReferenceNearMidpoints) {
  Rng rng(8);
  const int64_t T = 256, C = 256;
  std::vector<float> x(size_t(T * C));
  std::vector<float> midpoints;
  for (uint32_t code = 0; code < 0x7e; ++code)
    midpoints.push_back((fp8_e4m3_to_f32(uint8_t(code)) + fp8_e4m3_to_f32(uint8_t(code + 1))) / 2);
  for (int64_t blk = 0; blk < T * C / 128; ++blk) {
    float* xb = &x[size_t(blk * 128)];
    const float amax = std::ldexp(float(1.0 + rng.uniform()), rng.below(250) - 124);
    const float scale = amax / 448.0f;
    xb[0] = amax;
    for (int i = 1; i < 128; ++i) {
      float v = midpoints[size_t(rng.below(int(midpoints.size())))] * scale;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      bits += uint32_t(rng.below(13)) - 6u;  // within 6 ulps either side
      std::memcpy(&v, &bits, 4);
      v = std::fmin(v, amax);
      xb[i] = rng.below(2) ? v : -v;
    }
  }
  std::vector<uint8_t> q_ref(x.size()), q(x.size());
  std::vector<float> s_ref(size_t(T * C / 128)), s(s_ref.size());
  quantize_fp8(x.data(), T, C, q_ref.data(), s_ref.data());
  for (int64_t t = 0; t < T; ++t)
    quantize_fp8_row(&x[size_t(t * C)], C, &q[size_t(t * C)], &s[size_t(t * C / 128)]);
  ASSERT_EQ(std::memcmp(s.data(), s_ref.data(), s.size() * 4), 0);
  for (size_t i = 0; i < q.size(); ++i)
    ASSERT_EQ(q[i], q_ref[i]) << "channel " << i << " x " << x[i] << " scale "
                              << s_ref[i / 128];
}

LowLatencyConfig small_config(DType dtype) {
  LowLatencyConfig c;
  c.num_max_dispatch_tokens_per_rank = 4;
  c.hidden = 256;
  c.num_experts = 4;
  c.num_topk = 2;
  c.dispatch_dtype = dtype;
  return c;
}

// One rank, fp8 from bf16 input: slots equal quantize_fp8 of the bf16 values.
TEST(EpLowLatencyFp8, QuantizesBf16InputLikeTheReference) {
  transport::Communicator comm{transport::Config{}};
  LowLatencyBuffer buffer(comm, small_config(DType::F8E4M3));
  std::vector<uint16_t> x(4 * 256);
  std::vector<float> xf(x.size());
  Rng rng(9);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = f32_to_bf16(float(rng.uniform() * 6 - 3) * (i < 256 ? 1e-3f : 1.0f));
    xf[i] = bf16_to_f32(x[i]);
  }
  const std::vector<topk_idx_t> idx = {0, 1, 2, 3, 1, -1, 3, 0};  // [4, 2]
  LowLatencyRecv recv;
  buffer.dispatch({x.data(), DType::BF16, 4, 256}, idx.data(), recv);
  std::vector<uint8_t> q(x.size());
  std::vector<float> scales(4 * 2);
  quantize_fp8(xf.data(), 4, 256, q.data(), scales.data());
  const int P = buffer.slot_capacity();
  for (int i = 0; i < 8; ++i) {
    if (idx[size_t(i)] < 0) continue;
    int pos = 0;  // rank of token i/2 among the tokens of its expert
    for (int j = 0; j < i; ++j) pos += idx[size_t(j)] == idx[size_t(i)];
    const int64_t row = idx[size_t(i)] * P + pos, t = i / 2;
    EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(recv.recv_x) + row * 256, &q[size_t(t * 256)],
                          256), 0) << "pair " << i;
    EXPECT_EQ(std::memcmp(recv.recv_x_scales + row * 2, &scales[size_t(t * 2)], 8), 0);
  }
}

TEST(EpLowLatencyInput, BadCallsNameTheProblem) {
  transport::Communicator comm{transport::Config{}};
  LowLatencyConfig bad = small_config(DType::F8E4M3);
  bad.hidden = 100;
  EXPECT_THROW(
      {
        try {
          LowLatencyBuffer b(comm, bad);
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::BadInput);
          EXPECT_NE(std::string(e.what()).find("hidden % 128 == 0, got 100"), std::string::npos);
          throw;
        }
      },
      Error);
  LowLatencyBuffer buffer(comm, small_config(DType::BF16));
  std::vector<uint16_t> x(5 * 256);
  std::vector<topk_idx_t> idx(10, 0);
  try {
    buffer.dispatch_send({x.data(), DType::BF16, 5, 256}, idx.data());
    ADD_FAILURE() << "5 tokens above T_max = 4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("5 tokens on rank 0, above "
                                         "num_max_dispatch_tokens_per_rank = 4"),
              std::string::npos) << e.what();
  }
  idx[3] = 4;
  try {
    buffer.dispatch_send({x.data(), DType::BF16, 4, 256}, idx.data());
    ADD_FAILURE() << "expert 4 of 4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_idx[1, 1] = 4"), std::string::npos) << e.what();
  }
  Tensor out;
  EXPECT_THROW(buffer.combine_recv(nullptr, out), Error);  // no combine in flight
}

}  // namespace
}  // namespace moerl::ep::testing
