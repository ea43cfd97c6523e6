// Batched autoregressive generation with a KV cache. Every sequence of a batch advances
// one token per step (prompt tokens first, then sampled ones), so prompts of different
// lengths share the GEMMs of each step. Each sample owns an RNG seeded by
// (campaign seed, iteration, prompt id, sample index) and draws one uniform per generated
// token, so a sample does not depend on which other samples share its batch's RNG.
//
// Continuous batching (SampleParams::max_batch = B > 0): at most B sequences decode at once,
// in B slots of the KV cache; when a sequence finishes, the next not-yet-started request
// (request order) takes its slot at the next step, so the schedule is the same on every run.
#pragma once

#include <cstdint>
#include <functional>  // std::function for the progress callback
#include <vector>

#include "model/expert_comm.h"
#include "model/moe_decode.h"
#include "model/weights.h"

namespace moerl::model {

struct SampleParams {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  float top_p = 1.0f;        // nucleus: keep the smallest prefix of sorted probs with mass >= top_p
  int top_k = 0;             // 0 = no top-k truncation
  int max_new_tokens = 16;
  std::vector<int32_t> eos_ids = {1};  // a sampled token among these stops its sequence
  bool use_kv_cache = true;  // false: recompute the whole prefix every step (benchmark only)
  int max_batch = 0;  // sequences decoding at once (KV cache slots); 0 = all requests
};

// Slots of the KV cache (and rows of a step at most) that generate() uses for n requests.
int decode_slots(const SampleParams& params, int num_requests);

// Bytes of the KV cache for `slots` sequences: k and v, every layer, max_seq_len rows of dim.
int64_t kv_cache_bytes(const ModelConfig& cfg, int slots);

struct SampleRequest {
  std::vector<int32_t> prompt;  // non-empty
  uint64_t rng_seed = 0;        // from sample_seed()
};

struct SampleResult {
  std::vector<int32_t> tokens;   // generated tokens, <eos> included when stopped
  std::vector<float> logprobs;   // [tokens] log p(token) under softmax(logits / temperature)
                                 // (temperature 1 when greedy), before top-k/top-p truncation
  bool stopped = false;          // true: ended with <eos>; false: hit a length limit
};

// splitmix64 chain over the four ids: the per-sample RNG seed of the rank contract.
uint64_t sample_seed(uint64_t campaign_seed, uint64_t iteration, uint64_t prompt_id,
                     uint64_t sample_index);

// Reports progress after every decode step: `step` = new tokens of the furthest sample so far
// (each step adds at most one per sample, so at most max_new_tokens), `tokens` = new tokens of
// all samples so far. Called on the generating thread; it must not throw.
using GenerateProgress = std::function<void(int step, int64_t tokens)>;

void generate(ParamStore& ps, ExpertComm& comm, const std::vector<SampleRequest>& requests,
              const SampleParams& params, std::vector<SampleResult>& results,
              const GenerateProgress& progress = nullptr);

// The same decode loop with the MoE of each layer through `moe` (on R ranks: this rank's
// requests; every rank steps until all ranks' samples are done). KV cache only.
void generate(ParamStore& ps, MoeDecode& moe, const std::vector<SampleRequest>& requests,
              const SampleParams& params, std::vector<SampleResult>& results,
              const GenerateProgress& progress = nullptr);

}  // namespace moerl::model
