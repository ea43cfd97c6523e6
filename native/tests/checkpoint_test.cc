// Checkpoints: round trip, re-sharding on load, the moments in optimizer files a reader of the
// weights does without, version 1 checkpoints (moments inside the weights files) still loading,
// and each corruption case failing with a message that names the file (and the tensor where one
// is at fault).
#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/check.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace moerl::io {
namespace {

namespace fs = std::filesystem;

model::ModelConfig config() {
  model::ModelConfig c;
  c.vocab_size = 12;
  c.max_seq_len = 8;
  c.dim = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_experts = 4;
  c.top_k = 2;
  c.expert_dim = 4;
  return c;
}

struct CheckpointTest : ::testing::Test {
  std::string dir;
  transport::Communicator tc{transport::Config{}};
  model::ExpertComm comm{tc, config().num_experts};
  model::ParamStore ps{model::make_layout(config(), 0, 4)};
  OptimizerState opt;

  void SetUp() override {
    dir = (fs::temp_directory_path() /
           ("moerl-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name()))
              .string();
    fs::remove_all(dir);
    ps.init_random(3);
    opt.reset(ps.layout);
    for (size_t i = 0; i < opt.m_dense.size(); i++) opt.m_dense[i] = 0.001f * i;
    for (size_t i = 0; i < opt.v_experts.size(); i++) opt.v_experts[i] = 0.002f * i;
    opt.step = 17;
    save_checkpoint(dir, ps, opt, comm, "{\"iteration\":3}");
  }
  void TearDown() override { fs::remove_all(dir); }

  std::string load_error() {
    model::ParamStore other(ps.layout);
    OptimizerState o;
    try {
      load_checkpoint(dir, other, o);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      return e.what();
    }
    return "";
  }

  // Rewrites the manifest's sha256 and size for `name` to match the file on disk.
  void refresh_manifest_entry(const std::string& name) {
    std::string text = read_file(dir + "/manifest.json");
    Json m = parse_json(text, "manifest");
    for (const Json& f : array_field(m, "files", "m")) {
      if (string_field(f, "name", "f") != name) continue;
      uint64_t bytes = 0;
      std::string digest = sha256_file(dir + "/" + name, &bytes);
      size_t at = text.find(string_field(f, "sha256", "f"));
      text.replace(at, 64, digest);
      std::string old_bytes = "\"bytes\":" + std::to_string(integer_field(f, "bytes", "f"));
      at = text.find(old_bytes, text.find("\"" + name + "\""));
      text.replace(at, old_bytes.size(), "\"bytes\":" + std::to_string(bytes));
    }
    write_file_atomic(dir + "/manifest.json", text);
  }
};

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string m(1000, 'a');  // crosses block boundaries
  EXPECT_EQ(sha256_hex(m.data(), m.size()),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  const char* two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // FIPS 180-2
  EXPECT_EQ(sha256_hex(two_blocks, std::strlen(two_blocks)),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, FileEqualsBufferAcrossReadBoundaries) {
  std::string data(3 * (1 << 20) + 7, '\0');  // several 1 MiB reads and a short tail
  for (size_t i = 0; i < data.size(); i++) data[i] = (char)(i * 131 + (i >> 12));
  std::string path = (fs::temp_directory_path() / ("moerl-sha-" + std::to_string(::getpid()))).string();
  write_file_atomic(path, data);
  uint64_t bytes = 0;
  EXPECT_EQ(sha256_file(path, &bytes), sha256_hex(data.data(), data.size()));
  EXPECT_EQ(bytes, data.size());
  fs::remove(path);
}

TEST_F(CheckpointTest, RoundTripIsExact) {
  EXPECT_TRUE(fs::exists(dir + "/dense.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/experts-rank0.safetensors"));
  EXPECT_EQ(read_checkpoint_config(dir).dim, 8);
  model::ParamStore back(ps.layout);
  OptimizerState o;
  load_checkpoint(dir, back, o);
  EXPECT_EQ(back.dense, ps.dense);
  EXPECT_EQ(back.experts, ps.experts);
  EXPECT_EQ(o.m_dense, opt.m_dense);
  EXPECT_EQ(o.v_experts, opt.v_experts);
  EXPECT_EQ(o.step, 17);
  Json m = parse_json(read_file(dir + "/manifest.json"), "manifest");
  EXPECT_EQ(integer_field(field(m, "meta", "m"), "iteration", "m"), 3);
}

std::set<std::string> tensor_names(const std::string& path) {
  std::set<std::string> out;
  for (const auto& [name, t] : read_safetensors(path).tensors) out.insert(name);
  return out;
}

std::vector<std::string> manifest_files(const std::string& dir) {
  std::vector<std::string> out;
  Json m = parse_json(read_file(dir + "/manifest.json"), "manifest");
  for (const Json& f : array_field(m, "files", "m")) out.push_back(string_field(f, "name", "f"));
  return out;
}

TEST_F(CheckpointTest, MomentsLiveInOptimizerFilesTheManifestLists) {
  EXPECT_EQ(manifest_files(dir),
            (std::vector<std::string>{"dense.safetensors", "experts-rank0.safetensors",
                                      "optimizer-dense.safetensors",
                                      "optimizer-experts-rank0.safetensors"}));
  EXPECT_EQ(integer_field(parse_json(read_file(dir + "/manifest.json"), "m"), "version", "m"), 2);
  // The weights files hold the parameters and nothing else; the optimizer files both moments.
  std::set<std::string> dense, moments;
  for (const model::TensorSpec& s : ps.layout.dense) {
    dense.insert(s.name);
    moments.insert("adam.m." + s.name);
    moments.insert("adam.v." + s.name);
  }
  EXPECT_EQ(tensor_names(dir + "/dense.safetensors"), dense);
  EXPECT_EQ(tensor_names(dir + "/optimizer-dense.safetensors"), moments);
  // A third of the bytes: each moment has the parameter's size.
  const auto bytes = [&](const char* name) { return (double)fs::file_size(dir + "/" + name); };
  EXPECT_NEAR(bytes("optimizer-experts-rank0.safetensors") / bytes("experts-rank0.safetensors"), 2.0, 0.1);
}

TEST_F(CheckpointTest, WeightsLoadWithoutTheOptimizerFiles) {
  fs::remove(dir + "/optimizer-dense.safetensors");
  fs::remove(dir + "/optimizer-experts-rank0.safetensors");
  model::ParamStore back(ps.layout);
  load_weights(dir, back);
  EXPECT_EQ(back.dense, ps.dense);
  EXPECT_EQ(back.experts, ps.experts);
  // The trainer needs them: missing is bad input naming the file.
  std::string err = load_error();
  EXPECT_NE(err.find("optimizer-dense.safetensors is missing"), std::string::npos) << err;
}

TEST_F(CheckpointTest, FreshMomentsWriteNoOptimizerFiles) {
  fs::remove_all(dir);
  save_checkpoint(dir, ps, OptimizerState{}, comm);
  EXPECT_EQ(manifest_files(dir), (std::vector<std::string>{"dense.safetensors", "experts-rank0.safetensors"}));
  EXPECT_FALSE(fs::exists(dir + "/optimizer-dense.safetensors"));
  model::ParamStore back(ps.layout);
  OptimizerState o;
  load_checkpoint(dir, back, o);
  EXPECT_EQ(back.dense, ps.dense);
  EXPECT_EQ(o.step, 0);
  EXPECT_EQ(o.m_dense, std::vector<float>(ps.layout.dense_numel, 0.0f));
  EXPECT_EQ(o.v_experts, std::vector<float>(ps.layout.expert_numel, 0.0f));
  // Steps taken but no moments listed: they were lost, not zeros.
  std::string text = read_file(dir + "/manifest.json");
  text.replace(text.find("\"optimizer_step\":0"), 18, "\"optimizer_step\":5");
  write_file_atomic(dir + "/manifest.json", text);
  std::string err = load_error();
  EXPECT_NE(err.find("optimizer_step is 5 but it lists no optimizer-dense.safetensors"), std::string::npos)
      << err;
}

TEST_F(CheckpointTest, LoadsIntoAnotherShardingOfTheExperts) {
  // As rank 1 of 2: experts 2 and 3 only.
  model::ParamStore half(model::make_layout(config(), 2, 2));
  OptimizerState o;
  load_checkpoint(dir, half, o);
  for (const model::TensorSpec& s : half.layout.experts) {
    const float* want = ps.find(s.name);
    const float* got = half.experts.data() + s.offset;
    for (size_t i = 0; i < s.numel; i++) ASSERT_EQ(got[i], want[i]) << s.name;
  }
}

TEST_F(CheckpointTest, MissingManifestMeansNotCommitted) {
  fs::remove(dir + "/manifest.json");
  EXPECT_NE(load_error().find("manifest.json"), std::string::npos);
}

TEST_F(CheckpointTest, FlippedByteInAnOptimizerFileFailsChecksum) {
  std::string path = dir + "/optimizer-experts-rank0.safetensors";
  std::string data = read_file(path);
  data[data.size() - 5] ^= 0x40;
  write_file_atomic(path, data);
  std::string err = load_error();
  EXPECT_NE(err.find("optimizer-experts-rank0.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("sha256"), std::string::npos) << err;
  model::ParamStore back(ps.layout);
  load_weights(dir, back);  // the weights never read it
}

TEST_F(CheckpointTest, FlippedByteFailsChecksum) {
  std::string path = dir + "/dense.safetensors";
  std::string data = read_file(path);
  data[data.size() - 5] ^= 0x40;
  write_file_atomic(path, data);
  std::string err = load_error();
  EXPECT_NE(err.find("dense.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("sha256"), std::string::npos) << err;
}

TEST_F(CheckpointTest, TruncatedExpertFileFailsSize) {
  std::string path = dir + "/experts-rank0.safetensors";
  std::string data = read_file(path);
  write_file_atomic(path, data.substr(0, data.size() / 2));
  std::string err = load_error();
  EXPECT_NE(err.find("experts-rank0.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("size"), std::string::npos) << err;
}

TEST_F(CheckpointTest, WrongShapeNamesFileAndTensor) {
  // A self-consistent file (checksum refreshed) whose wqkv has the wrong shape.
  SafetensorsFile f = read_safetensors(dir + "/dense.safetensors");
  std::vector<TensorOut> out;
  std::vector<std::vector<float>> keep;
  for (const auto& [name, t] : f.tensors) {
    keep.emplace_back((t.end - t.begin) / 4);
    std::memcpy(keep.back().data(), f.data.data() + t.begin, t.end - t.begin);
    std::vector<int64_t> shape = t.shape;
    if (name == "layers.1.wqkv") shape = {shape[1], shape[0]};
    out.push_back({name, shape, keep.back().data()});
  }
  write_safetensors(dir + "/dense.safetensors", out);
  refresh_manifest_entry("dense.safetensors");
  std::string err = load_error();
  EXPECT_NE(err.find("dense.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("layers.1.wqkv"), std::string::npos) << err;
  EXPECT_NE(err.find("shape"), std::string::npos) << err;
}

TEST_F(CheckpointTest, MissingTensorNamesFileAndTensor) {
  SafetensorsFile f = read_safetensors(dir + "/experts-rank0.safetensors");
  std::vector<TensorOut> out;
  std::vector<std::vector<float>> keep;
  for (const auto& [name, t] : f.tensors) {
    if (name == "layers.0.experts.3.w2") continue;
    keep.emplace_back((t.end - t.begin) / 4);
    std::memcpy(keep.back().data(), f.data.data() + t.begin, t.end - t.begin);
    out.push_back({name, t.shape, keep.back().data()});
  }
  write_safetensors(dir + "/experts-rank0.safetensors", out);
  refresh_manifest_entry("experts-rank0.safetensors");
  std::string err = load_error();
  EXPECT_NE(err.find("experts-rank0.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("layers.0.experts.3.w2"), std::string::npos) << err;
}

TEST_F(CheckpointTest, WrongDtypeNamesFileAndTensor) {
  std::string path = dir + "/dense.safetensors";
  std::string data = read_file(path);
  size_t at = data.find("\"F32\"");  // first tensor in the header
  data.replace(at, 5, "\"F16\"");
  write_file_atomic(path, data);
  refresh_manifest_entry("dense.safetensors");
  std::string err = load_error();
  EXPECT_NE(err.find("dense.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("dtype F16"), std::string::npos) << err;
}

TEST_F(CheckpointTest, ConfigMismatchIsBadInput) {
  model::ModelConfig c = config();
  c.dim = 16;
  model::ParamStore other(model::make_layout(c, 0, 4));
  OptimizerState o;
  EXPECT_THROW(load_checkpoint(dir, other, o), Error);
}

// A checkpoint of manifest version 1, the moments inside the weights files, as moe_train wrote
// them before the optimizer files (golden/checkpoint-v1: init --seed 1 --dim 8 --layers 1
// --heads 2 --experts 4 --top-k 2 --expert-dim 8 --max-seq-len 32, then sft --task reverse
// --steps 3, on 2 ranks): what a campaign in flight across the upgrade has committed.
TEST(CheckpointV1, InlineMomentsStillLoadAndResaveAsVersion2) {
  const std::string v1 = std::string(MOERL_GOLDEN_DIR) + "/checkpoint-v1";
  const model::ModelConfig cfg = read_checkpoint_config(v1);
  transport::Communicator tc{transport::Config{}};
  model::ExpertComm comm{tc, cfg.num_experts};
  model::ParamStore ps{model::make_layout(cfg, 0, cfg.num_experts)};
  OptimizerState opt;
  load_checkpoint(v1, ps, opt);
  EXPECT_EQ(opt.step, 3);
  // Every value as the old files hold it: parameters and both moments, none of them zeros.
  SafetensorsFile dense = read_safetensors(v1 + "/dense.safetensors");
  size_t nonzero = 0;
  for (const model::TensorSpec& s : ps.layout.dense) {
    std::vector<float> p(s.numel), m(s.numel), v(s.numel);
    dense.read_f32(s.name, s.shape, p.data());
    dense.read_f32("adam.m." + s.name, s.shape, m.data());
    dense.read_f32("adam.v." + s.name, s.shape, v.data());
    for (size_t i = 0; i < s.numel; i++) {
      ASSERT_EQ(ps.dense[s.offset + i], p[i]) << s.name;
      ASSERT_EQ(opt.m_dense[s.offset + i], m[i]) << s.name;
      ASSERT_EQ(opt.v_dense[s.offset + i], v[i]) << s.name;
      nonzero += m[i] != 0.0f;
    }
  }
  EXPECT_GT(nonzero, 0u) << "the fixture's moments must not be zeros";
  SafetensorsFile rank1 = read_safetensors(v1 + "/experts-rank1.safetensors");
  for (const model::TensorSpec& s : ps.layout.experts) {
    if (s.expert < 2) continue;
    std::vector<float> v(s.numel);
    rank1.read_f32("adam.v." + s.name, s.shape, v.data());
    for (size_t i = 0; i < s.numel; i++) ASSERT_EQ(opt.v_experts[s.offset + i], v[i]) << s.name;
  }
  // The weights alone, and re-sharded.
  model::ParamStore weights{ps.layout};
  load_weights(v1, weights);
  EXPECT_EQ(weights.dense, ps.dense);
  EXPECT_EQ(weights.experts, ps.experts);
  model::ParamStore half{model::make_layout(cfg, 2, 2)};
  OptimizerState half_opt;
  load_checkpoint(v1, half, half_opt);
  std::map<std::string, size_t> offset;
  for (const model::TensorSpec& s : ps.layout.experts) offset[s.name] = s.offset;
  for (const model::TensorSpec& s : half.layout.experts)
    for (size_t i = 0; i < s.numel; i++) {
      ASSERT_EQ(half.experts[s.offset + i], ps.experts[offset.at(s.name) + i]) << s.name;
      ASSERT_EQ(half_opt.m_experts[s.offset + i], opt.m_experts[offset.at(s.name) + i]) << s.name;
    }
  // Saved again (the next update's output): version 2, the same values.
  const std::string out = (fs::temp_directory_path() / ("moerl-ckpt-v1-" + std::to_string(::getpid()))).string();
  fs::remove_all(out);
  save_checkpoint(out, ps, opt, comm);
  EXPECT_TRUE(fs::exists(out + "/optimizer-experts-rank0.safetensors"));
  model::ParamStore again{ps.layout};
  OptimizerState again_opt;
  load_checkpoint(out, again, again_opt);
  EXPECT_EQ(again.dense, ps.dense);
  EXPECT_EQ(again.experts, ps.experts);
  EXPECT_EQ(again_opt.m_dense, opt.m_dense);
  EXPECT_EQ(again_opt.v_experts, opt.v_experts);
  EXPECT_EQ(again_opt.step, 3);
  fs::remove_all(out);
}

}  // namespace
}  // namespace moerl::io
