// fp8 e4m3 row quantizer of the low-latency dispatch: quantize_fp8 (dtype.h) for one row,
// bit for bit (the tests compare), eight channels per instruction where the CPU has AVX2.
#if defined(__x86_64__)
#include <immintrin.h>  // AVX2 intrinsics
#endif

#include <cmath>    // std::fmax, std::fabs
#include <cstring>  // std::memcpy

#include "ep/dtype.h"  // bf16_to_f32, kFp8E4M3Max
#include "ep/low_latency_detail.h"

namespace moerl::ep {
namespace {

// quantize_fp8_row for CPUs without AVX2: the same steps, one channel at a time.
void quantize_fp8_row_scalar(const float* x, int64_t C, uint8_t* q, float* scales) {
  for (int64_t b = 0; b < C / kFp8BlockSize; ++b) {
    const float* xb = x + b * kFp8BlockSize;
    float amax = 0.0f;
    for (int i = 0; i < kFp8BlockSize; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
    scales[b] = scale;
    for (int i = 0; i < kFp8BlockSize; ++i)
      q[b * kFp8BlockSize + i] = f32_to_fp8_e4m3_fast(xb[i] / scale);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// Eight channels per instruction, the same arithmetic as f32_to_fp8_e4m3_fast (GCC does not
// vectorize its selects by itself). amax runs on the magnitudes' bits: for non-negative
// floats the integer order is the float order, and a NaN counts as 0, as in std::fmax.
// Input: fp32, or bf16 widened on load (its bits are the top half of the fp32's).
__attribute__((target("avx2"))) inline __m256 load8(const float* x) {
  return _mm256_loadu_ps(x);
}
__attribute__((target("avx2"))) inline __m256 load8(const uint16_t* x) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2"))) inline __m256i set1(int32_t v) { return _mm256_set1_epi32(v); }

template <typename In>
__attribute__((target("avx2"))) void quantize_fp8_row_avx2(const In* x, int64_t C, uint8_t* q,
                                                           float* scales) {
  const __m256i abs_mask = set1(0x7fffffff), inf = set1(0x7f800000);
  for (int64_t b = 0; b < C / kFp8BlockSize; ++b) {
    const In* xb = x + b * kFp8BlockSize;
    __m256i amax = _mm256_setzero_si256();
    for (int i = 0; i < kFp8BlockSize; i += 8) {
      const __m256i a = _mm256_and_si256(_mm256_castps_si256(load8(xb + i)), abs_mask);
      amax = _mm256_max_epi32(amax, _mm256_andnot_si256(_mm256_cmpgt_epi32(a, inf), a));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), amax);
    int32_t amax_bits = 0;
    for (const int32_t v : lanes) amax_bits = v > amax_bits ? v : amax_bits;
    float amax_f;
    std::memcpy(&amax_f, &amax_bits, 4);
    const float scale = amax_f > 0.0f ? amax_f / kFp8E4M3Max : 1.0f;
    scales[b] = scale;
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int i = 0; i < kFp8BlockSize; i += 32) {
      __m256i r[4];
      for (int j = 0; j < 4; ++j) {
        const __m256i bits =
            _mm256_castps_si256(_mm256_div_ps(load8(xb + i + 8 * j), vscale));
        const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), set1(0x80));
        const __m256i a = _mm256_and_si256(bits, abs_mask);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), set1(1));
        const __m256i normal = _mm256_sub_epi32(
            _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, set1(0x7ffff)), odd), 20),
            set1(120 << 3));
        const __m256 shifted = _mm256_add_ps(
            _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)),
            _mm256_set1_ps(8388608.0f));
        const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(shifted), set1(0x4b000000));
        __m256i mag = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(set1(0x3c800000), a));
        mag = _mm256_blendv_epi8(mag, set1(0x7e), _mm256_cmpgt_epi32(a, set1(0x43dfffff)));
        r[j] = _mm256_blendv_epi8(_mm256_or_si256(sign, mag), set1(0x7f),
                                  _mm256_cmpgt_epi32(a, inf));
      }
      // 32 codes (each < 256) -> 32 bytes; the packs work per 128-bit lane, the permute
      // puts the four groups of eight back in order.
      const __m256i packed = _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]),
                                                 _mm256_packus_epi32(r[2], r[3]));
      const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kFp8BlockSize + i),
                          _mm256_permutevar8x32_epi32(packed, order));
    }
  }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
bool has_avx2() {
  static const bool yes = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
  return yes;
}
#endif

}  // namespace

void quantize_fp8_row(const float* x, int64_t C, uint8_t* q, float* scales) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2()) return quantize_fp8_row_avx2(x, C, q, scales);
#endif
  quantize_fp8_row_scalar(x, C, q, scales);
}

void quantize_fp8_row(const uint16_t* x, int64_t C, float* scratch, uint8_t* q, float* scales) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2()) return quantize_fp8_row_avx2(x, C, q, scales);
#endif
  for (int64_t c = 0; c < C; ++c) scratch[c] = bf16_to_f32(x[c]);
  quantize_fp8_row_scalar(scratch, C, q, scales);
}

}  // namespace moerl::ep
