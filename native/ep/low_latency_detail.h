// Internals shared by low_latency.cc (dispatch) and low_latency_combine.cc: the per-peer
// state, the signal message format and the fp8 row quantizer.
#pragma once

#include <cstdint>  // int32_t, int64_t, uint8_t, uint32_t
#include <cstring>  // std::memcpy
#include <string>
#include <vector>

#include "ep/host_memory.h"  // HostBytes
#include "ep/low_latency.h"

namespace moerl::ep {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOERL_LL_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MOERL_LL_KERNEL
#endif

struct LowLatencyBuffer::Peer {
  std::vector<int32_t> count;    // [L] pairs this rank routes to each of the peer's experts
                                 //   (true counts, may exceed P)
  std::vector<int64_t> offset;   // [L+1] rows of expert e in send_rows (counts capped at P)
  HostBytes send_rows;           // [<= T_max*K, C] packed rows for the peer (not for self)
  std::vector<uint8_t> signal_out, signal_in;  // Signal messages to / from the peer
};

// Signal message, one per (source, destination) per dispatch:
//   int32 [4]  overflow of the source: destination rank (-1 none), local expert, count, 0
//   int32 [L]  pairs per local expert of the destination (true counts)
//   fp32  [n, S] fp8 scales of the rows sent, in send order (fp8 only)
namespace signal {
inline size_t bytes(int L, size_t num_scales) {
  return (4 + size_t(L)) * sizeof(int32_t) + num_scales * sizeof(float);
}
inline const int32_t* header(const uint8_t* m) { return reinterpret_cast<const int32_t*>(m); }
inline const int32_t* counts(const uint8_t* m) { return header(m) + 4; }
inline float* scales(uint8_t* m, int L) {
  return reinterpret_cast<float*>(m + (4 + size_t(L)) * sizeof(int32_t));
}
inline const float* scales(const uint8_t* m, int L) {
  return reinterpret_cast<const float*>(m + (4 + size_t(L)) * sizeof(int32_t));
}
inline void fill(uint8_t* m, int L, const int32_t* count, int32_t overflow_rank,
                 int32_t overflow_expert, int32_t overflow_count) {
  const int32_t head[4] = {overflow_rank, overflow_expert, overflow_count, 0};
  std::memcpy(m, head, sizeof(head));
  std::memcpy(m + sizeof(head), count, size_t(L) * sizeof(int32_t));
}
}  // namespace signal

std::string overflow_message(int source, int dest, int local_expert, int num_local_experts,
                             int count, int capacity);

// f32_to_fp8_e4m3 (dtype.h) without frexp/ldexp, bit for bit the same (the tests compare):
// round to nearest even on the float's bits, subnormals through the 2^23 magic number.
inline uint8_t f32_to_fp8_e4m3_fast(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 24) & 0x80u, abs = bits & 0x7fffffffu;
  // Normal e4m3: keep 3 mantissa bits (RNE, a carry bumps the exponent), rebias 127 -> 7.
  const uint32_t normal = ((abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20) - (120u << 3);
  float a;
  std::memcpy(&a, &abs, 4);
  const float shifted = a * 512.0f + 8388608.0f;  // a / 2^-9 rounded to an integer (< 9)
  uint32_t sub;
  std::memcpy(&sub, &shifted, 4);
  sub -= 0x4b000000u;
  const uint32_t magnitude = abs >= 0x43e00000u ? 0x7eu            // >= 448: saturate
                             : abs < 0x3c800000u ? sub             // < 2^-6: subnormal
                                                 : normal;
  return uint8_t(abs > 0x7f800000u ? 0x7fu : (sign | magnitude));  // NaN: 0x7f
}

// x [C] fp32 -> q [C] e4m3, scales [C/128]: quantize_fp8 (dtype.h) for one row, vectorized.
void quantize_fp8_row(const float* x, int64_t C, uint8_t* q, float* scales);
// The same from bf16 x [C] (scratch [C] fp32 for CPUs without AVX2).
void quantize_fp8_row(const uint16_t* x, int64_t C, float* scratch, uint8_t* q, float* scales);

}  // namespace moerl::ep
