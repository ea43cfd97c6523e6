// Internals shared by low_latency.cc (dispatch) and low_latency_combine.cc: the per-peer
// state, the dispatch message format and the fp8 row quantizer.
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
  std::vector<int64_t> offset;   // [L+1] rows of expert e in the message (counts capped at P)
  HostBytes send_msg;            // dispatch message to the peer (not for self)
  HostBytes recv_msg;            // dispatch message from the peer (per slot: its signal)
};

// Dispatch in per-peer messages or per-slot messages: at decode sizes a message costs more than
// copying its bytes, so the rows for a peer travel in ONE message with the counts in its header
// (the receiver copies them into the slots); when the average message of the per-slot scheme is
// large (uniform routing: T_max*K/E rows) the copies cost more than the messages save, so rows go
// straight into the slots, one message per (peer, local expert), plus the header as a signal.
// Decided from the config, so every rank agrees without a word; the threshold sits between the
// shapes measured in docs/benchmarks.md (8 KiB per slot message: packed is cheaper; 28 and 56 KiB:
// per slot).
constexpr size_t kPackBelowSlotBytes = 16 << 10;
inline bool packs_per_peer(const LowLatencyConfig& c, size_t row_bytes) {
  const double rows = double(c.num_max_dispatch_tokens_per_rank) * c.num_topk / c.num_experts;
  return rows * double(row_bytes) <= double(kPackBelowSlotBytes);
}

// Dispatch message per (source, destination) and dispatch; the receive is posted once at full
// capacity. Packed: the whole message. Per slot: the header and scales are the signal
// message, the rows go as one message per local expert from their place here.
//   int32 [4]  overflow of the source: destination rank (-1 none), local expert, count, 0
//   int32 [L]  pairs per local expert of the destination (true counts)
//   fp32  [n, S] fp8 scales of the rows (fp8 only), at 64 bytes
//   rows  [n, row_bytes] at 64 bytes: the pairs, grouped by local expert (min(count, P)
//              each), each group in ascending source token order
namespace message {
inline size_t align64(size_t n) { return (n + 63) / 64 * 64; }
inline size_t header_bytes(int L) { return align64((4 + size_t(L)) * sizeof(int32_t)); }
inline size_t signal_bytes(int L, size_t n, size_t S) {
  return header_bytes(L) + n * S * sizeof(float);
}
inline size_t rows_offset(int L, size_t n, size_t S) { return align64(signal_bytes(L, n, S)); }
inline size_t bytes(int L, size_t n, size_t row_bytes, size_t S) {
  return rows_offset(L, n, S) + n * row_bytes;
}
inline const int32_t* header(const uint8_t* m) { return reinterpret_cast<const int32_t*>(m); }
inline const int32_t* counts(const uint8_t* m) { return header(m) + 4; }
inline float* scales(uint8_t* m, int L) { return reinterpret_cast<float*>(m + header_bytes(L)); }
inline const float* scales(const uint8_t* m, int L) {
  return reinterpret_cast<const float*>(m + header_bytes(L));
}
inline uint8_t* rows(uint8_t* m, int L, size_t n, size_t S) { return m + rows_offset(L, n, S); }
inline const uint8_t* rows(const uint8_t* m, int L, size_t n, size_t S) {
  return m + rows_offset(L, n, S);
}
inline void fill(uint8_t* m, int L, const int32_t* count, int32_t overflow_rank,
                 int32_t overflow_expert, int32_t overflow_count) {
  const int32_t head[4] = {overflow_rank, overflow_expert, overflow_count, 0};
  std::memcpy(m, head, sizeof(head));
  std::memcpy(m + sizeof(head), count, size_t(L) * sizeof(int32_t));
}
}  // namespace message

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
