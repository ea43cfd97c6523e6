// Scalar conversions for EP payloads: bf16 and fp8 e4m3 <-> fp32, and per-block fp8
// quantization (one fp32 scale per 128 channels, scale = amax / 448). Header-only so the
// model, the tests and the benchmark convert exactly the same way.
#pragma once

#include <cmath>    // std::fabs, std::isnan, std::ldexp, std::frexp
#include <cstdint>  // uint16_t, uint32_t, uint8_t
#include <cstring>  // std::memcpy for bit casts

namespace moerl::ep {

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet). Branch-free so row loops vectorize.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return uint16_t((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

constexpr float kFp8E4M3Max = 448.0f;

// e4m3 (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, 0x7f/0xff = NaN.
inline float fp8_e4m3_to_f32(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 3) & 0xf, mantissa = v & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) return NAN;
  if (exponent == 0) magnitude = std::ldexp(float(mantissa), -9);  // subnormal: m/8 * 2^-6
  else magnitude = std::ldexp(1.0f + float(mantissa) / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// Round to nearest even, saturating at +-448 (DeepEP and most FP8 recipes saturate).
inline uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;
  // Quantization step: 2^(e-3) for normals with exponent e >= -6, 2^-9 for subnormals.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the leading bit has weight 2^(e-1)
  int exp_unbiased = e - 1;
  if (exp_unbiased < -6) exp_unbiased = -6;
  const float step = std::ldexp(1.0f, exp_unbiased - 3);
  const float q = std::nearbyint(a / step) * step;  // default rounding mode: ties to even
  // Re-encode q exactly (it is representable; rounding may have bumped the exponent).
  if (q == 0.0f) return sign;
  int qe;
  const float qm = std::frexp(q, &qe);  // q = qm * 2^qe
  int biased = qe - 1 + 7;
  if (biased <= 0) return sign | uint8_t(std::lround(q / std::ldexp(1.0f, -9)));
  const int mantissa = int(std::lround((qm * 2.0f - 1.0f) * 8.0f));
  return sign | uint8_t(biased << 3) | uint8_t(mantissa);
}

// x [T, C] fp32 -> q [T, C] e4m3, scales [T, C/128] fp32 (C % 128 == 0).
inline void quantize_fp8(const float* x, int64_t num_tokens, int64_t num_channels, uint8_t* q,
                         float* scales) {
  const int64_t num_blocks = num_channels / 128;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      const float* xb = x + t * num_channels + b * 128;
      float amax = 0.0f;
      for (int i = 0; i < 128; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
      // Zero blocks keep scale 1 so dequantization never divides by zero.
      const float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      scales[t * num_blocks + b] = scale;
      uint8_t* qb = q + t * num_channels + b * 128;
      for (int i = 0; i < 128; ++i) qb[i] = f32_to_fp8_e4m3(xb[i] / scale);
    }
  }
}

// q [T, C] e4m3, scales [T, C/128] -> x [T, C] fp32.
inline void dequantize_fp8(const uint8_t* q, const float* scales, int64_t num_tokens,
                           int64_t num_channels, float* x) {
  const int64_t num_blocks = num_channels / 128;
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t c = 0; c < num_channels; ++c)
      x[t * num_channels + c] =
          fp8_e4m3_to_f32(q[t * num_channels + c]) * scales[t * num_blocks + c / 128];
}

}  // namespace moerl::ep
