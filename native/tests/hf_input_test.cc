// Hostile Hugging Face directories and safetensors files: every config field within its bound
// (64-bit products, no 32-bit wrap, no silent truncation of a JSON integer), an index that names
// a file outside the directory, and safetensors headers whose data ranges overlap, leave the
// file or disagree with dtype x shape. Each is BadInput naming the field or the file and tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "bad_input.h"
#include "common/check.h"
#include "io/hf.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace moerl::io {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, named after it.
std::string temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path d = fs::path(::testing::TempDir()) /
                     (std::string("moerl_hf_input_") + info->test_suite_name() + "_" + info->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// A tiny Qwen3-MoE config.json with `changes` merged over it.
Json qwen_config(const Json& changes = Json::object()) {
  Json j = {{"model_type", "qwen3_moe"}, {"vocab_size", 32},       {"hidden_size", 16},
            {"num_hidden_layers", 1},    {"num_attention_heads", 2}, {"num_key_value_heads", 1},
            {"head_dim", 8},             {"num_experts_per_tok", 1}, {"num_experts", 2},
            {"moe_intermediate_size", 8}, {"rms_norm_eps", 1e-6},    {"max_position_embeddings", 64}};
  j.update(changes);
  return j;
}

std::string write_config(const Json& config) {
  const std::string dir = temp_dir();
  write_file_atomic(dir + "/config.json", config.dump());
  return dir;
}

using moerl::testing::bad_input;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(HfConfigBounds, AnIntegerBeyond32BitsIsNamedNotTruncated) {
  // 4294967328 = 2^32 + 32 was read as 32
  const std::string dir = write_config(qwen_config({{"vocab_size", 4294967328LL}}));
  const std::string e = bad_input([&] { read_hf_config(dir, 0); });
  EXPECT_HAS(e, "vocab_size");
  EXPECT_HAS(e, "4294967328");
  EXPECT_HAS(e, "32-bit");
}

TEST(HfConfigBounds, HeadsTimesHeadDimThatWrapsIsRejected) {
  // 65537 * 65536 wraps an int to 65536: the config was accepted, generation then crashed
  const std::string dir = write_config(qwen_config(
      {{"num_attention_heads", 65537}, {"num_key_value_heads", 65537}, {"head_dim", 65536}}));
  const std::string e = bad_input([&] { read_hf_config(dir, 0); });
  EXPECT_HAS(e, "num_heads = 65537 exceeds the bound 65536");
  EXPECT_HAS(e, "kMaxDim");

  // each within its bound, their product not
  const std::string e2 = bad_input([&] {
    read_hf_config(write_config(qwen_config({{"num_attention_heads", 1024},
                                             {"num_key_value_heads", 1024},
                                             {"head_dim", 1024}})),
                   0);
  });
  EXPECT_HAS(e2, "(num_heads + 2 num_kv_heads) * head_dim = 3145728 exceeds the bound 262144");
}

TEST(HfConfigBounds, AnAbsurdConfigIsBadInputBeforeAnyAllocation) {
  // every field within its own bound, the parameter count (~8.6e17) far beyond kMaxParams
  const std::string dir = write_config(qwen_config({{"vocab_size", 4000000},
                                                    {"hidden_size", 65536},
                                                    {"num_hidden_layers", 1024},
                                                    {"num_experts", 16384},
                                                    {"moe_intermediate_size", 262144}}));
  const std::string e = bad_input([&] { read_hf_config(dir, 0); });
  EXPECT_HAS(e, "the parameter count = ");
  EXPECT_HAS(e, "exceeds the bound 1099511627776 (kMaxParams in native/model/config.h; a build "
                "with it raised allows more)");
}

TEST(HfConfigBounds, EachDimensionIsBounded) {
  struct Case {
    const char* hf_field;
    int64_t value;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{{"vocab_size", 1 << 23, "vocab_size = 8388608"},
                                         {"max_position_embeddings", 1 << 22, "max_seq_len = 4194304"},
                                         {"num_hidden_layers", 1025, "num_layers = 1025"},
                                         {"num_experts", 16385, "num_experts = 16385"},
                                         {"moe_intermediate_size", 1 << 19, "expert_dim = 524288"},
                                         {"intermediate_size", 1 << 19, "dense_dim = 524288"},
                                         {"hidden_size", 1 << 17, "dim = 131072"}}) {
    const std::string dir = write_config(qwen_config({{c.hf_field, c.value}}));
    const std::string e = bad_input([&] { read_hf_config(dir, 0); });
    EXPECT_HAS(e, std::string(c.says) + " exceeds the bound");
  }
}

TEST(HfConfigBounds, TheParameterCountIsTheLayoutsCount) {
  for (const Json& changes : {Json::object(), Json{{"tie_word_embeddings", true}},
                              Json{{"mlp_only_layers", {0}}, {"intermediate_size", 24}}}) {
    const HfModel m = read_hf_config(write_config(qwen_config(changes)), 0);
    const model::ParamLayout l = model::make_layout(m.cfg, 0, m.cfg.num_experts);
    EXPECT_EQ(model::num_params(m.cfg), (int64_t)(l.dense_numel + l.expert_numel)) << changes.dump();
  }
  model::ModelConfig learned;  // moerl's own architecture: learned positions, no qk norm
  learned.vocab_size = 32, learned.max_seq_len = 16, learned.dim = 8, learned.num_layers = 2;
  learned.num_heads = 2, learned.num_experts = 4, learned.top_k = 2, learned.expert_dim = 12;
  const model::ParamLayout l = model::make_layout(learned, 0, 4);
  EXPECT_EQ(model::num_params(learned), (int64_t)(l.dense_numel + l.expert_numel));
}

TEST(HfIndex, ShardNamesOutsideTheDirectoryAreRejected) {
  for (const std::string& file : {"../model.safetensors", "/etc/passwd", "sub/model.safetensors",
                                  "..", ".hidden.safetensors", "a\\b.safetensors", ""}) {
    const std::string dir = write_config(qwen_config());
    const Json index = {{"weight_map", {{"model.embed_tokens.weight", file}}}};
    write_file_atomic(dir + "/model.safetensors.index.json", index.dump());
    const HfModel m = read_hf_config(dir, 0);
    model::ParamStore ps(model::make_layout(m.cfg, 0, m.cfg.num_experts), false);
    const std::string e = bad_input([&] { load_hf_weights(m, ps); });
    EXPECT_HAS(e, "model.safetensors.index.json: tensor model.embed_tokens.weight maps to " +
                      Json(file).dump() + ", not a file name of this directory");
  }
}

// A safetensors file of `header` and `data_bytes` zero bytes.
std::string write_raw_safetensors(const std::string& dir, const Json& header, size_t data_bytes) {
  const std::string h = header.dump();
  std::string raw(8, '\0');
  for (int i = 0; i < 8; i++) raw[i] = (char)((h.size() >> (8 * i)) & 0xff);
  raw += h + std::string(data_bytes, '\0');
  const std::string path = dir + "/t.safetensors";
  write_file_atomic(path, raw);
  return path;
}

Json tensor(const std::string& dtype, const std::vector<int64_t>& shape, int64_t b, int64_t e) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
}

TEST(SafetensorsHeader, OverlappingRangesAreRejectedNamingBothTensors) {
  const std::string path = write_raw_safetensors(
      temp_dir(), {{"a", tensor("F32", {4}, 0, 16)}, {"b", tensor("F32", {4}, 8, 24)}}, 24);
  const std::string e = bad_input([&] { read_safetensors_header(path); });
  EXPECT_HAS(e, "t.safetensors: tensor b data range [8,24) overlaps tensor a [0,16)");
  const std::string same = write_raw_safetensors(
      temp_dir(), {{"a", tensor("F32", {4}, 0, 16)}, {"b", tensor("BF16", {8}, 0, 16)}}, 16);
  EXPECT_HAS(bad_input([&] { read_safetensors(same); }), "overlaps tensor a [0,16)");
}

TEST(SafetensorsHeader, ARangeThatDisagreesWithDtypeAndShapeIsRejected) {
  const std::string dir = temp_dir();
  const std::string path = write_raw_safetensors(dir, {{"w", tensor("BF16", {3, 2}, 0, 16)}}, 16);
  EXPECT_HAS(bad_input([&] { read_safetensors_header(path); }),
             "t.safetensors tensor w: data range [0,16) holds 16 bytes, its dtype BF16 and shape "
             "[3,2] take 12");
  // a shape whose element count overflows 64 bits is named, not wrapped into a small count
  const std::string huge = write_raw_safetensors(
      dir, {{"w", tensor("F32", {4294967296LL, 4294967296LL, 4}, 0, 16)}}, 16);
  EXPECT_HAS(bad_input([&] { read_safetensors_header(huge); }), "does not fit the file's 16 data bytes");
  const std::string outside = write_raw_safetensors(dir, {{"w", tensor("F32", {4}, 0, 16)}}, 8);
  EXPECT_HAS(bad_input([&] { read_safetensors_header(outside); }),
             "tensor w: data range [0,16) outside the 8 data bytes");
}

TEST(SafetensorsHeader, WhatTheWriterWritesStillReads) {
  const std::string path = temp_dir() + "/w.safetensors";
  const std::vector<float> a = {1, 2, 3}, b = {4, 5};
  write_safetensors(path, {{"a", {3}, a.data()}, {"empty", {0, 4}, nullptr}, {"b", {2}, b.data()}},
                    "BF16");
  const SafetensorsHeader h = read_safetensors_header(path);
  std::vector<float> out(2);
  read_tensor_f32(h, "b", {2}, out.data());
  EXPECT_EQ(out, b);
}

}  // namespace
}  // namespace moerl::io
