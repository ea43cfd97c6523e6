// bf16 and fp8 e4m3 conversions (ep/dtype.h) against brute-force references: every fp8 code
// round-trips, and every float rounds to the nearest representable value (ties to even),
// saturating at +-448.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ep/dtype.h"

namespace moerl::ep {
namespace {

TEST(EpDtype, EveryFp8CodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float f = fp8_e4m3_to_f32(uint8_t(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << code;
      continue;
    }
    EXPECT_EQ(f32_to_fp8_e4m3(f), uint8_t(code)) << "code " << code << " value " << f;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

// Nearest finite e4m3 value by search; ties go to the even code (mantissa LSB 0).
uint8_t nearest_fp8(float x) {
  if (std::fabs(x) >= 448.0f) return std::signbit(x) ? 0xfe : 0x7e;
  uint8_t best = 0;
  float best_err = INFINITY;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    const float v = fp8_e4m3_to_f32(uint8_t(code));
    if (std::signbit(v) != std::signbit(x)) continue;
    const float err = std::fabs(v - x);
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best = uint8_t(code);
      best_err = err;
    }
  }
  return best;
}

TEST(EpDtype, Fp8RoundsToNearestEvenAndSaturates) {
  uint64_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int exponent = int((state >> 33) % 24) - 14;  // covers subnormals to saturation
    const float mantissa = float((state >> 8) & 0xffffff) / float(1 << 24);
    float x = std::ldexp(1.0f + mantissa, exponent);
    if (state & 1) x = -x;
    ASSERT_EQ(f32_to_fp8_e4m3(x), nearest_fp8(x)) << x;
  }
  // Exact midpoints between neighbours go to the even code.
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = fp8_e4m3_to_f32(uint8_t(code)), hi = fp8_e4m3_to_f32(uint8_t(code + 1));
    const float mid = 0.5f * (lo + hi);
    EXPECT_EQ(f32_to_fp8_e4m3(mid), uint8_t((code & 1) ? code + 1 : code)) << mid;
  }
}

TEST(EpDtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  uint32_t bits = 0x3f808000;  // exactly halfway between 0x3f80 and 0x3f81: even is 0x3f80
  float f;
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(f32_to_bf16(f), 0x3f80);
  bits = 0x3f818000;  // halfway between 0x3f81 and 0x3f82: even is 0x3f82
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(f32_to_bf16(f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;  // NaNs
    EXPECT_EQ(f32_to_bf16(bf16_to_f32(uint16_t(h))), h);
  }
}

TEST(EpDtype, QuantizeFp8PerBlockScales) {
  std::vector<float> x(2 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 97) - 48) * (i < 256 ? 0.01f : 3.0f);
  std::vector<uint8_t> q(x.size());
  std::vector<float> scales(4), back(x.size());
  quantize_fp8(x.data(), 2, 256, q.data(), scales.data());
  dequantize_fp8(q.data(), scales.data(), 2, 256, back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float scale = scales[i / 128];
    EXPECT_LE(std::fabs(back[i] - x[i]), std::fabs(x[i]) / 16 + scale * 0x1.0p-9f) << i;
  }
}

}  // namespace
}  // namespace moerl::ep
