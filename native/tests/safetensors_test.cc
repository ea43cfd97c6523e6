// safetensors in F32, BF16 and F16: what is written reads back, values from the narrow dtypes
// survive a round trip bitwise (so an HF import then export is bitwise), and fp32 values round
// to nearest even, subnormals and overflow included. Against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace moerl::io {
namespace {

float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/moerl_safetensors_" + name;
}

// Writes `values` as dtype, reads them back as fp32.
std::vector<float> round_trip(const std::vector<float>& values, const std::string& dtype) {
  const std::string path = temp_path(dtype + ".safetensors");
  write_safetensors(path, {{"t", {(int64_t)values.size()}, values.data()}}, dtype);
  SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.tensors.at("t").dtype, dtype);
  std::vector<float> out(values.size());
  read_tensor_f32(h, "t", {(int64_t)values.size()}, out.data());
  std::remove(path.c_str());
  return out;
}

TEST(Safetensors, Bf16RoundsToNearestEvenAndKeepsItsOwnValues) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1); a hair above rounds up
  std::vector<float> in = {1.0f, 1.0f + 0x1p-8f, bits(0x3f808001u), -2.5f, 0.0f, 3.0e38f};
  std::vector<float> out = round_trip(in, "BF16");
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], 1.0f + 0x1p-7f);
  EXPECT_EQ(out[3], -2.5f);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(round_trip(out, "BF16"), out);  // bf16 values come back bitwise
}

TEST(Safetensors, F16RoundsSubnormalsAndOverflowAsIeeeHalf) {
  std::vector<float> in = {1.0f + 0x1p-11f,  // halfway: ties to even, 1
                           1.0f + 0x1p-11f + 0x1p-20f,  // above halfway: 1 + 2^-10
                           0x1p-24f,          // the smallest subnormal
                           0x1p-25f,          // halfway to it: ties to even, 0
                           3 * 0x1p-25f,      // 1.5 units: rounds to 2 units
                           65504.0f,          // the largest finite half
                           65520.0f,          // rounds past it: infinity
                           -0.0f};
  std::vector<float> out = round_trip(in, "F16");
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + 0x1p-10f);
  EXPECT_EQ(out[2], 0x1p-24f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], 2 * 0x1p-24f);
  EXPECT_EQ(out[5], 65504.0f);
  EXPECT_TRUE(std::isinf(out[6]) && out[6] > 0);
  EXPECT_TRUE(out[7] == 0.0f && std::signbit(out[7]));
  std::vector<float> finite(out.begin(), out.begin() + 6);
  EXPECT_EQ(round_trip(finite, "F16"), finite);  // half values come back bitwise
}

TEST(Safetensors, NullDataWritesZerosAndATruncatedHeaderIsNamed) {
  const std::string path = temp_path("zeros.safetensors");
  write_safetensors(path, {{"z", {3, 2}, nullptr}});
  std::vector<float> out(6, 1.0f);
  read_tensor_f32(read_safetensors_header(path), "z", {3, 2}, out.data());
  EXPECT_EQ(out, std::vector<float>(6, 0.0f));
  std::string raw = read_file(path);
  write_file_atomic(path, raw.substr(0, 20));
  try {
    read_safetensors_header(path);
    FAIL() << "a truncated header was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_NE(std::string(e.what()).find("truncated header"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace moerl::io
