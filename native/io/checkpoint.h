// Checkpoint directory (docs/native-model.md, "Checkpoints"). The weights: dense.safetensors
// (replicated tensors, rank 0) and experts-rank<r>.safetensors (rank r's experts, global expert
// ids in the names). The AdamW moments ("adam.m.<name>" / "adam.v.<name>") in files of their own,
// optimizer-dense.safetensors and optimizer-experts-rank<r>.safetensors, so a reader of the policy
// (a rollout, an export, the KL reference) reads a third of the bytes; a checkpoint that never
// took an optimizer step has none. manifest.json (config, world size, optimizer step, files with
// bytes and sha256) is written LAST: a directory without a manifest is not a checkpoint.
// Checkpoints of manifest version 1 keep the moments inside the weights files; they still load.
// Loading re-shards experts, so a checkpoint written by R ranks loads on any R' that divides
// num_experts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/expert_comm.h"
#include "model/weights.h"

namespace moerl::io {

// AdamW first/second moments in the same layout as the parameters.
// Empty moments at step 0 (a default OptimizerState) stand for zeros: a fresh checkpoint costs
// no memory for them, and is saved without optimizer files.
struct OptimizerState {
  std::vector<float> m_dense, m_experts, v_dense, v_experts;
  int64_t step = 0;  // optimizer steps taken so far
  void reset(const model::ParamLayout& layout);
};

// Collective over comm's ranks. Each rank writes into its own `dir`, one directory shared by
// all ranks or one private to the rank (pods with separate filesystems): rank 0
// dense.safetensors and optimizer-dense.safetensors, rank r experts-rank<r>.safetensors and
// optimizer-experts-rank<r>.safetensors (no optimizer files for fresh moments); each rank hashes
// its own files, rank 0 gathers the (name, bytes, sha256) records and writes manifest.json last.
// A rank whose `dir` does not hold rank 0's manifest then adds its own copies of the dense files
// (from its replica, checked against rank 0's digests) and manifest.json, so it can load the
// checkpoint from its own directory. Every file of every directory is byte for byte the file of
// that name a shared directory gets. meta_json: a JSON object stored as "meta" in the manifest
// (e.g. {"iteration":3}); "{}" if none.
void save_checkpoint(const std::string& dir, const model::ParamStore& ps,
                     const OptimizerState& opt, model::ExpertComm& comm,
                     const std::string& meta_json = "{}");

// Reads and validates manifest.json; returns the config (throws BadInput naming the file).
model::ModelConfig read_checkpoint_config(const std::string& dir);

// Fills ps (built for this rank's layout) and opt: what the trainer continues from. Reads only
// manifest.json, the dense files and the (optimizer-)experts files holding this rank's experts,
// so a rank-local directory with just those loads; a missing one is BadInput naming it. Verifies
// the sha256 and size of every file read, then names, shapes and dtypes of every tensor. Errors
// name file and tensor.
void load_checkpoint(const std::string& dir, model::ParamStore& ps, OptimizerState& opt);

// Fills ps only: the policy, for sampling, scoring, export and the KL reference. As
// load_checkpoint, but reads no optimizer file, so a directory without them loads.
void load_weights(const std::string& dir, model::ParamStore& ps);

}  // namespace moerl::io
