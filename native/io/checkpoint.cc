// Checkpoint save/load with a sha256 manifest written last.
#include "io/checkpoint.h"

#include <cstdio>   // std::remove
#include <map>
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace moerl::io {
namespace {

constexpr const char* kFormat = "moerl-checkpoint";
constexpr int kVersion = 1;

std::string expert_file(int rank) { return "experts-rank" + std::to_string(rank) + ".safetensors"; }

// The tensors of one arena: parameters then both moments, in layout order.
std::vector<TensorOut> arena_tensors(const std::vector<model::TensorSpec>& specs, const float* p,
                                     const float* m, const float* v) {
  std::vector<TensorOut> out;
  for (const model::TensorSpec& s : specs) out.push_back({s.name, s.shape, p + s.offset});
  for (const model::TensorSpec& s : specs) out.push_back({"adam.m." + s.name, s.shape, m + s.offset});
  for (const model::TensorSpec& s : specs) out.push_back({"adam.v." + s.name, s.shape, v + s.offset});
  return out;
}

model::ModelConfig config_from_json(const Json& j, const std::string& what) {
  model::ModelConfig c;
  c.vocab_size = (int)j.at("vocab_size", what).integer(what + " vocab_size");
  c.max_seq_len = (int)j.at("max_seq_len", what).integer(what + " max_seq_len");
  c.dim = (int)j.at("dim", what).integer(what + " dim");
  c.num_layers = (int)j.at("num_layers", what).integer(what + " num_layers");
  c.num_heads = (int)j.at("num_heads", what).integer(what + " num_heads");
  c.num_experts = (int)j.at("num_experts", what).integer(what + " num_experts");
  c.top_k = (int)j.at("top_k", what).integer(what + " top_k");
  c.expert_dim = (int)j.at("expert_dim", what).integer(what + " expert_dim");
  c.norm_eps = (float)j.at("norm_eps", what).number(what + " norm_eps");
  model::validate(c);
  return c;
}

struct Manifest {
  model::ModelConfig cfg;
  int world_size = 1;
  int64_t optimizer_step = 0;
  std::map<std::string, std::pair<uint64_t, std::string>> files;  // name -> (bytes, sha256)
};

Manifest read_manifest(const std::string& dir) {
  std::string path = dir + "/manifest.json";
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error&) {
    MOERL_FAIL(BadInput, "checkpoint ", dir, " has no readable manifest.json; it was never ",
               "committed (the manifest is written last) - use an earlier checkpoint");
  }
  Json j = parse_json(text, path);
  MOERL_CHECK_INPUT(j.at("format", path).string(path + " format") == kFormat, path,
                    ": format is not ", kFormat);
  MOERL_CHECK_INPUT(j.at("version", path).integer(path + " version") == kVersion, path,
                    ": unsupported version (this build reads version ", kVersion, ")");
  Manifest m;
  m.cfg = config_from_json(j.at("config", path), path + " config");
  m.world_size = (int)j.at("world_size", path).integer(path + " world_size");
  MOERL_CHECK_INPUT(m.world_size > 0 && m.cfg.num_experts % m.world_size == 0, path,
                    ": world_size ", m.world_size, " does not divide num_experts");
  m.optimizer_step = j.at("optimizer_step", path).integer(path + " optimizer_step");
  for (const Json& f : j.at("files", path).array(path + " files")) {
    std::string name = f.at("name", path + " files").string(path + " file name");
    m.files[name] = {(uint64_t)f.at("bytes", path + " " + name).integer(path + " bytes"),
                     f.at("sha256", path + " " + name).string(path + " sha256")};
  }
  return m;
}

// Checks size and checksum against the manifest, then parses the file.
SafetensorsFile open_verified(const std::string& dir, const Manifest& m, const std::string& name) {
  auto it = m.files.find(name);
  MOERL_CHECK_INPUT(it != m.files.end(), dir, "/manifest.json does not list ", name);
  std::string path = dir + "/" + name;
  uint64_t bytes = 0;
  std::string digest = sha256_file(path, &bytes);
  MOERL_CHECK_INPUT(bytes == it->second.first, path, ": size ", bytes, " bytes, manifest says ",
                    it->second.first, " (truncated or replaced file)");
  MOERL_CHECK_INPUT(digest == it->second.second, path, ": sha256 ", digest,
                    " does not match the manifest's ", it->second.second, " (corrupted file)");
  return read_safetensors(path);
}

}  // namespace

void OptimizerState::reset(const model::ParamLayout& l) {
  m_dense.assign(l.dense_numel, 0.0f);
  v_dense.assign(l.dense_numel, 0.0f);
  m_experts.assign(l.expert_numel, 0.0f);
  v_experts.assign(l.expert_numel, 0.0f);
  step = 0;
}

void save_checkpoint(const std::string& dir, const model::ParamStore& ps,
                     const OptimizerState& opt, model::ExpertComm& comm,
                     const std::string& meta_json) {
  const model::ParamLayout& l = ps.layout;
  MOERL_CHECK(opt.m_dense.size() == l.dense_numel && opt.m_experts.size() == l.expert_numel,
              "optimizer state does not match the parameter layout");
  const int R = comm.world_size();
  if (comm.rank() == 0) {
    make_dirs(dir);
    // A stale manifest must not vouch for the files we are about to overwrite.
    std::remove((dir + "/manifest.json").c_str());
  }
  comm.barrier();
  if (comm.rank() == 0)
    write_safetensors(dir + "/dense.safetensors",
                      arena_tensors(l.dense, ps.dense.data(), opt.m_dense.data(), opt.v_dense.data()));
  write_safetensors(dir + "/" + expert_file(comm.rank()),
                    arena_tensors(l.experts, ps.experts.data(), opt.m_experts.data(),
                                  opt.v_experts.data()));
  comm.barrier();
  if (comm.rank() == 0) {
    std::ostringstream os;
    os << "{\"format\":\"" << kFormat << "\",\"version\":" << kVersion
       << ",\"config\":" << model::config_to_json(l.cfg) << ",\"world_size\":" << R
       << ",\"optimizer_step\":" << opt.step << ",\"meta\":" << meta_json << ",\"files\":[";
    for (int r = -1; r < R; r++) {
      std::string name = r < 0 ? "dense.safetensors" : expert_file(r);
      uint64_t bytes = 0;
      std::string digest = sha256_file(dir + "/" + name, &bytes);
      os << (r < 0 ? "" : ",") << "{\"name\":\"" << name << "\",\"bytes\":" << bytes
         << ",\"sha256\":\"" << digest << "\"}";
    }
    os << "]}\n";
    write_file_atomic(dir + "/manifest.json", os.str());
  }
  comm.barrier();
}

model::ModelConfig read_checkpoint_config(const std::string& dir) { return read_manifest(dir).cfg; }

void load_checkpoint(const std::string& dir, model::ParamStore& ps, OptimizerState& opt) {
  Manifest m = read_manifest(dir);
  const model::ParamLayout& l = ps.layout;
  const model::ModelConfig& c = l.cfg;
  MOERL_CHECK_INPUT(model::config_to_json(m.cfg) == model::config_to_json(c), dir,
                    ": checkpoint config ", model::config_to_json(m.cfg),
                    " differs from the model's ", model::config_to_json(c));
  opt.reset(l);
  opt.step = m.optimizer_step;
  {
    SafetensorsFile f = open_verified(dir, m, "dense.safetensors");
    for (const model::TensorSpec& s : l.dense) {
      f.read_f32(s.name, s.shape, ps.dense.data() + s.offset);
      f.read_f32("adam.m." + s.name, s.shape, opt.m_dense.data() + s.offset);
      f.read_f32("adam.v." + s.name, s.shape, opt.v_dense.data() + s.offset);
    }
  }
  // Experts: each lives in the file of the rank that owned it when saved.
  const int per_saved_rank = c.num_experts / m.world_size;
  std::map<int, SafetensorsFile> files;
  for (const model::TensorSpec& s : l.experts) {
    int owner = s.expert / per_saved_rank;
    if (!files.count(owner)) files.emplace(owner, open_verified(dir, m, expert_file(owner)));
    const SafetensorsFile& f = files.at(owner);
    f.read_f32(s.name, s.shape, ps.experts.data() + s.offset);
    f.read_f32("adam.m." + s.name, s.shape, opt.m_experts.data() + s.offset);
    f.read_f32("adam.v." + s.name, s.shape, opt.v_experts.data() + s.offset);
  }
}

}  // namespace moerl::io
