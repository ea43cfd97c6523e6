// Checkpoint save/load with a sha256 manifest written last.
#include "io/checkpoint.h"

#include <cstdio>   // std::remove
#include <cstring>  // std::memcpy, std::memcmp
#include <fstream>  // std::ifstream: does a file exist
#include <map>
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/sha256.h"

namespace moerl::io {
namespace {

constexpr const char* kFormat = "moerl-checkpoint";
// 2: the moments in optimizer files of their own; 1 (still read): inside the weights files.
constexpr int kVersion = 2;
constexpr const char* kDenseFile = "dense.safetensors";

std::string expert_file(int rank) { return "experts-rank" + std::to_string(rank) + ".safetensors"; }
// The file holding the AdamW moments of the tensors in `weights_file` (version 2).
std::string optimizer_file(const std::string& weights_file) { return "optimizer-" + weights_file; }

// The parameters of one arena, in layout order.
std::vector<TensorOut> weight_tensors(const std::vector<model::TensorSpec>& specs, const float* p) {
  std::vector<TensorOut> out;
  for (const model::TensorSpec& s : specs) out.push_back({s.name, s.shape, p + s.offset});
  return out;
}

// Both moments of one arena, m then v, in layout order.
std::vector<TensorOut> moment_tensors(const std::vector<model::TensorSpec>& specs, const float* m,
                                      const float* v) {
  std::vector<TensorOut> out;
  for (const model::TensorSpec& s : specs) out.push_back({"adam.m." + s.name, s.shape, m + s.offset});
  for (const model::TensorSpec& s : specs) out.push_back({"adam.v." + s.name, s.shape, v + s.offset});
  return out;
}

model::ModelConfig config_from_json(const Json& j, const std::string& what) {
  model::ModelConfig c;
  c.vocab_size = int_field(j, "vocab_size", what);
  c.max_seq_len = int_field(j, "max_seq_len", what);
  c.dim = int_field(j, "dim", what);
  c.num_layers = int_field(j, "num_layers", what);
  c.num_heads = int_field(j, "num_heads", what);
  c.num_experts = int_field(j, "num_experts", what);
  c.top_k = int_field(j, "top_k", what);
  c.expert_dim = int_field(j, "expert_dim", what);
  c.norm_eps = (float)number_field(j, "norm_eps", what);
  // Hugging Face family fields: absent in moerl-architecture checkpoints.
  auto has = [&](const char* key) { return j.contains(key); };
  if (has("num_kv_heads")) c.num_kv_heads = int_field(j, "num_kv_heads", what);
  if (has("head_dim")) c.head_dim = int_field(j, "head_dim", what);
  if (has("rope_theta")) c.rope_theta = (float)number_field(j, "rope_theta", what);
  if (has("qk_norm")) c.qk_norm = bool_field(j, "qk_norm", what);
  if (has("norm_topk_prob")) c.norm_topk_prob = bool_field(j, "norm_topk_prob", what);
  if (has("tie_embeddings")) c.tie_embeddings = bool_field(j, "tie_embeddings", what);
  if (has("dense_layers")) {
    c.dense_dim = int_field(j, "dense_dim", what);
    for (const Json& l : array_field(j, "dense_layers", what))
      c.dense_layers.push_back(as_int(l, what + " dense_layers"));
  }
  if (has("pad_token_id")) c.pad_token_id = int_field(j, "pad_token_id", what);
  if (has("balance_loss")) {
    const std::string& b = string_field(j, "balance_loss", what);
    MOERL_CHECK_INPUT(b == "batch" || b == "sequence", what, ": balance_loss must be batch or ",
                      "sequence, got ", b);
    c.balance_loss = b == "batch" ? model::BalanceLoss::Batch : model::BalanceLoss::Sequence;
  }
  model::validate(c);
  return c;
}

// One manifest entry as a fixed-size record, so ranks can gather it as plain bytes.
struct FileRecord {
  char name[64] = {};    // NUL-terminated
  uint64_t bytes = 0;
  char sha256[64] = {};  // hex digits, not terminated
};

FileRecord file_record(const std::string& dir, const std::string& name) {
  FileRecord f;
  MOERL_CHECK(name.size() < sizeof f.name, "file name ", name, " is too long for a record");
  std::memcpy(f.name, name.data(), name.size());
  std::string digest = sha256_file(dir + "/" + name, &f.bytes);
  MOERL_CHECK(digest.size() == sizeof f.sha256, "sha256 digest of ", name, " has ", digest.size(),
              " hex digits");
  std::memcpy(f.sha256, digest.data(), sizeof f.sha256);
  return f;
}

struct Manifest {
  int version = kVersion;
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
  MOERL_CHECK_INPUT(string_field(j, "format", path) == kFormat, path, ": format is not ", kFormat);
  Manifest m;
  const int64_t version = integer_field(j, "version", path);
  MOERL_CHECK_INPUT(version == 1 || version == kVersion, path, ": unsupported version ", version,
                    " (this build reads versions 1 to ", kVersion, ")");
  m.version = (int)version;
  m.cfg = config_from_json(field(j, "config", path), path + " config");
  m.world_size = int_field(j, "world_size", path);
  MOERL_CHECK_INPUT(m.world_size > 0 && m.cfg.num_experts % m.world_size == 0, path,
                    ": world_size ", m.world_size, " does not divide num_experts");
  m.optimizer_step = integer_field(j, "optimizer_step", path);
  for (const Json& f : array_field(j, "files", path)) {
    std::string name = string_field(f, "name", path + " files");
    m.files[name] = {(uint64_t)integer_field(f, "bytes", path + " " + name),
                     string_field(f, "sha256", path + " " + name)};
  }
  return m;
}

// Checks size and checksum against the manifest, then parses the file.
// `what` says why this rank needs the file (for the error when it is missing).
SafetensorsFile open_verified(const std::string& dir, const Manifest& m, const std::string& name,
                              const std::string& what) {
  auto it = m.files.find(name);
  MOERL_CHECK_INPUT(it != m.files.end(), dir, "/manifest.json does not list ", name);
  std::string path = dir + "/" + name;
  // A rank's directory needs only the manifest, the dense files and the files of its own
  // experts (the files may have been fetched per rank, the optimizer files only for training).
  MOERL_CHECK_INPUT(std::ifstream(path).good(), path, " is missing: the manifest lists it and this ",
                    "rank needs it (", what, "); fetch it into ", dir, " next to manifest.json");
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
  // Empty moments at step 0 stand for zeros (a fresh checkpoint): no optimizer files.
  const bool fresh = opt.step == 0 && opt.m_dense.empty() && opt.m_experts.empty() &&
                     opt.v_dense.empty() && opt.v_experts.empty();
  MOERL_CHECK(fresh || (opt.m_dense.size() == l.dense_numel && opt.v_dense.size() == l.dense_numel &&
                        opt.m_experts.size() == l.expert_numel && opt.v_experts.size() == l.expert_numel),
              "optimizer state does not match the parameter layout");
  const int R = comm.world_size(), self = comm.rank();
  // Every rank writes into its own `dir`, which may be a directory shared by all ranks or
  // a rank-local one (pods with separate filesystems).
  make_dirs(dir);
  // A stale manifest must not vouch for the files we are about to overwrite; the barrier
  // keeps every write after every removal when the directory is shared.
  std::remove((dir + "/manifest.json").c_str());
  comm.barrier();
  // One arena's files: its weights, then (unless fresh) its moments; their records in that order.
  auto write_arena = [&](const std::string& name, const std::vector<model::TensorSpec>& specs,
                         const float* p, const std::vector<float>& m, const std::vector<float>& v) {
    std::vector<FileRecord> records;
    write_safetensors(dir + "/" + name, weight_tensors(specs, p));
    records.push_back(file_record(dir, name));
    if (!fresh) {
      write_safetensors(dir + "/" + optimizer_file(name), moment_tensors(specs, m.data(), v.data()));
      records.push_back(file_record(dir, optimizer_file(name)));
    }
    return records;
  };
  auto write_dense = [&] { return write_arena(kDenseFile, l.dense, ps.dense.data(), opt.m_dense, opt.v_dense); };
  const std::vector<FileRecord> dense = self == 0 ? write_dense() : std::vector<FileRecord>{};
  const std::vector<FileRecord> mine =
      write_arena(expert_file(self), l.experts, ps.experts.data(), opt.m_experts, opt.v_experts);
  // Each rank hashed its own files; rank 0 collects the experts records (the gather also
  // orders the manifest after every rank's write).
  const size_t per_rank = mine.size();  // the same on every rank: fresh or not
  std::vector<FileRecord> experts(self == 0 ? R * per_rank : 0);
  comm.communicator().gather(mine.data(), per_rank * sizeof(FileRecord), experts.data(), 0);
  std::string manifest;
  if (self == 0) {
    // The weights files first (dense, then experts by rank), then the optimizer files in the
    // same order.
    std::vector<const FileRecord*> files;
    for (size_t k = 0; k < per_rank; k++) {
      files.push_back(&dense[k]);
      for (int r = 0; r < R; r++) files.push_back(&experts[r * per_rank + k]);
    }
    std::ostringstream os;
    os << "{\"format\":\"" << kFormat << "\",\"version\":" << kVersion
       << ",\"config\":" << model::config_to_json(l.cfg) << ",\"world_size\":" << R
       << ",\"optimizer_step\":" << opt.step << ",\"meta\":" << meta_json << ",\"files\":[";
    for (size_t i = 0; i < files.size(); i++) {
      const FileRecord& f = *files[i];
      const int r = (int)(i % (R + 1)) - 1;  // -1: the dense file
      const std::string weights = r < 0 ? kDenseFile : expert_file(r);
      const std::string want = i < (size_t)R + 1 ? weights : optimizer_file(weights);
      MOERL_CHECK(std::string(f.name) == want, "rank ", std::max(r, 0), " reported file ", f.name,
                  " where ", want, " belongs");
      os << (i == 0 ? "" : ",") << "{\"name\":\"" << f.name << "\",\"bytes\":" << f.bytes
         << ",\"sha256\":\"" << std::string(f.sha256, sizeof f.sha256) << "\"}";
    }
    os << "]}\n";
    manifest = os.str();
    write_file_atomic(dir + "/manifest.json", manifest);
  }
  if (R == 1) return;
  // Every rank gets the manifest and rank 0's dense records, so that a rank whose directory is
  // not rank 0's can make it a checkpoint it can load itself (a later step of the same job).
  struct {
    FileRecord dense[2];  // weights, moments (fresh: weights only)
    uint64_t manifest_bytes = 0;
  } head;
  if (self == 0) {
    for (size_t k = 0; k < dense.size(); k++) head.dense[k] = dense[k];
    head.manifest_bytes = manifest.size();
  }
  comm.communicator().broadcast(&head, sizeof head, 0);
  manifest.resize(head.manifest_bytes);
  comm.communicator().broadcast(manifest.data(), manifest.size(), 0);
  comm.barrier();  // rank 0's manifest is in place
  if (self != 0) {
    // Rank 0's directory (shared): complete. Otherwise the dense files from this rank's replica
    // (bitwise rank 0's, the dense update being identical on every rank), then the manifest.
    const std::string path = dir + "/manifest.json";
    if (!std::ifstream(path).good() || read_file(path) != manifest) {
      const std::vector<FileRecord> own = write_dense();
      for (size_t k = 0; k < own.size(); k++) {
        const FileRecord &d = own[k], &want = head.dense[k];
        MOERL_CHECK(d.bytes == want.bytes && std::memcmp(d.sha256, want.sha256, sizeof d.sha256) == 0,
                    "rank ", self, "'s dense tensors differ from rank 0's (", dir, "/", d.name, " sha256 ",
                    std::string(d.sha256, sizeof d.sha256), " vs ",
                    std::string(want.sha256, sizeof want.sha256), "): the replicas diverged");
      }
      write_file_atomic(dir + "/manifest.json", manifest);
    }
  }
  comm.barrier();  // no rank returns before the checkpoint is committed everywhere
}

model::ModelConfig read_checkpoint_config(const std::string& dir) { return read_manifest(dir).cfg; }

namespace {

// The weights into ps and, with opt, the moments into opt (see load_checkpoint).
void load(const std::string& dir, model::ParamStore& ps, OptimizerState* opt) {
  Manifest m = read_manifest(dir);
  const model::ParamLayout& l = ps.layout;
  const model::ModelConfig& c = l.cfg;
  MOERL_CHECK_INPUT(model::config_to_json(m.cfg) == model::config_to_json(c), dir,
                    ": checkpoint config ", model::config_to_json(m.cfg),
                    " differs from the model's ", model::config_to_json(c));
  // Where the moments are: inside the weights files (version 1), in the optimizer files, or
  // nowhere (no optimizer files: a fresh checkpoint, zeros).
  const bool inline_moments = m.version == 1;
  const bool moment_files = !inline_moments && m.files.count(optimizer_file(kDenseFile)) > 0;
  if (opt) {
    MOERL_CHECK_INPUT(inline_moments || moment_files || m.optimizer_step == 0, dir,
                      "/manifest.json: optimizer_step is ", m.optimizer_step, " but it lists no ",
                      optimizer_file(kDenseFile), ", so the AdamW moments are missing");
    opt->reset(l);
    opt->step = m.optimizer_step;
  }
  const bool read_moments = opt && (inline_moments || moment_files);
  // An arena's weights file and the file its moments are read from (the same in version 1).
  struct Files {
    SafetensorsFile weights, moments;
    bool separate = false;
    const SafetensorsFile& of_moments() const { return separate ? moments : weights; }
  };
  auto open_files = [&](const std::string& name, const std::string& what) {
    Files f;
    f.weights = open_verified(dir, m, name, what);
    f.separate = read_moments && moment_files;
    if (f.separate) f.moments = open_verified(dir, m, optimizer_file(name), "the AdamW moments of " + what);
    return f;
  };
  auto read = [&](const Files& f, const model::TensorSpec& s, float* p, std::vector<float>* mo,
                  std::vector<float>* vo) {
    f.weights.read_f32(s.name, s.shape, p + s.offset);
    if (!read_moments) return;
    f.of_moments().read_f32("adam.m." + s.name, s.shape, mo->data() + s.offset);
    f.of_moments().read_f32("adam.v." + s.name, s.shape, vo->data() + s.offset);
  };
  {
    Files f = open_files(kDenseFile, "the dense tensors");
    for (const model::TensorSpec& s : l.dense)
      read(f, s, ps.dense.data(), opt ? &opt->m_dense : nullptr, opt ? &opt->v_dense : nullptr);
  }
  // Experts: each lives in the files of the rank that owned it when saved.
  const int per_saved_rank = c.num_experts / m.world_size;
  std::map<int, Files> files;
  for (const model::TensorSpec& s : l.experts) {
    int owner = s.expert / per_saved_rank;
    if (!files.count(owner)) {
      const int first = owner * per_saved_rank;
      files.emplace(owner, open_files(expert_file(owner), "experts " + std::to_string(first) + ".." +
                                                               std::to_string(first + per_saved_rank - 1)));
    }
    read(files.at(owner), s, ps.experts.data(), opt ? &opt->m_experts : nullptr,
         opt ? &opt->v_experts : nullptr);
  }
}

}  // namespace

void load_checkpoint(const std::string& dir, model::ParamStore& ps, OptimizerState& opt) {
  load(dir, ps, &opt);
}

void load_weights(const std::string& dir, model::ParamStore& ps) { load(dir, ps, nullptr); }

}  // namespace moerl::io
