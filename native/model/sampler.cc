// Sampler: KV-cached decode step, token choice (temperature, top-k, top-p) and a
// recompute-everything path used only to measure what the cache saves.
#include "model/sampler.h"

#include <algorithm>  // std::sort, std::max, std::find
#include <cmath>      // std::exp, std::log, std::sqrt
#include <numeric>    // std::iota

#include "common/check.h"
#include "model/kernels.h"  // attention over the KV cache
#include "model/model.h"
#include "model/moe.h"
#include "model/ops.h"

namespace moerl::model {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double next_uniform(uint64_t& s) { return (splitmix64(s) >> 11) * 0x1.0p-53; }

// out [N,OC] = inp [N,IC] @ weight [OC,IC]^T for a decode step's rows: the few-row kernel with
// fused multiply-adds (kernels.h), 64 rows at a time so that a block of inputs stays in L2
// while the weight streams through once per block. A row's result depends on its own input
// alone (never on N or on the other rows of the step), and the kernels do not depend on what
// OpenBLAS detects.
void step_matmul(float* out, const float* inp, const float* weight, int N, int IC, int OC) {
  constexpr int kBlock = 64;
  for (int i = 0; i < N; i += kBlock)
    kernels().matmul_small_fma(out + (size_t)i * OC, inp + (size_t)i * IC, weight,
                               std::min(kBlock, N - i), IC, OC, IC);
}

// KV cache: per layer, per sequence, T_max rows of k and v, each [Hkv*D] (after q/k-norm and
// RoPE, as attention reads them).
struct KvCache {
  int S = 0, T = 0, C = 0;
  std::vector<std::vector<float>> k, v;  // [L][S*T*C]
  float* key(int l, int s, int t) { return k[l].data() + ((size_t)s * T + t) * C; }
  float* val(int l, int s, int t) { return v[l].data() + ((size_t)s * T + t) * C; }
};

// One decode step: rows [n] feed token tokens[i] at position pos[i] of the sequence in cache
// slot seq[i]. Writes logits [m,V] of the m rows listed in logit_rows (those that pick a token
// next; a row still feeding its prompt needs none).
void decode_step(ParamStore& ps, MoeDecode& moe, KvCache& cache, const std::vector<int32_t>& seq,
                 const std::vector<int32_t>& tokens, const std::vector<int32_t>& pos,
                 const std::vector<int32_t>& logit_rows, std::vector<float>& logits) {
  const ModelConfig& cfg = ps.layout.cfg;
  const int n = (int)seq.size(), C = cfg.dim, H = cfg.num_heads, V = cfg.vocab_size;
  const int Hkv = kv_heads(cfg), D = head_dim(cfg), W = qkv_width(cfg), Q = q_width(cfg),
            KV = kv_width(cfg), G = H / Hkv;
  const float scale = 1.0f / std::sqrt((float)D);
  const Weights& w = ps.w;
  std::vector<float> x((size_t)n * C), h((size_t)n * C), rstd(n), qkv((size_t)n * W),
      att((size_t)n * Q), proj((size_t)n * C), scores((size_t)G * cfg.max_seq_len), qkv_raw,
      qk_rstd;
  MlpActs mlp;
  embedding_forward(x.data(), tokens.data(), pos.data(), w.wte, w.wpe, n, C);
  for (int l = 0; l < cfg.num_layers; l++) {
    const LayerWeights& lw = w.layers[l];
    rmsnorm_forward(h.data(), rstd.data(), x.data(), lw.ln1, n, C, cfg.norm_eps);
    if (cfg.qk_norm) {
      qkv_raw.resize((size_t)n * W);
      qk_rstd.resize((size_t)n * (H + Hkv));
      step_matmul(qkv_raw.data(), h.data(), lw.wqkv, n, C, W);
      qk_norm_forward(qkv.data(), qk_rstd.data(), qkv_raw.data(), lw, n, cfg);
    } else {
      step_matmul(qkv.data(), h.data(), lw.wqkv, n, C, W);
    }
    if (cfg.rope_theta > 0.0f) rope_forward(qkv.data(), pos.data(), n, W, H + Hkv, D, cfg.rope_theta);
    for (int i = 0; i < n; i++) {
      std::copy_n(qkv.data() + (size_t)i * W + Q, KV, cache.key(l, seq[i], pos[i]));
      std::copy_n(qkv.data() + (size_t)i * W + Q + KV, KV, cache.val(l, seq[i], pos[i]));
    }
    // attention over the cache, per row and kv head for the G query heads that read it:
    // scores [G, pos+1] = q k^T by the few-row kernel (k rows at stride KV in the cache), then
    // a softmax per query head and o = sum_s p_s v_s (kernels.h)
    for (int i = 0; i < n; i++) {
      const int len = pos[i] + 1;
      for (int kh = 0; kh < Hkv; kh++) {
        kernels().matmul_small(scores.data(), qkv.data() + (size_t)i * W + kh * G * D,
                               cache.key(l, seq[i], 0) + kh * D, G, D, len, KV);
        kernels().attend_cached(att.data() + (size_t)i * Q + kh * G * D, D, scores.data(),
                                cache.val(l, seq[i], 0) + kh * D, KV, G, len, D, scale);
      }
    }
    step_matmul(proj.data(), att.data(), lw.wo, n, Q, C);
    for (size_t j = 0; j < x.size(); j++) x[j] += proj[j];
    rmsnorm_forward(h.data(), rstd.data(), x.data(), lw.ln2, n, C, cfg.norm_eps);
    if (is_dense_layer(cfg, l))
      swiglu_mlp_forward(proj.data(), h.data(), n, C, cfg.dense_dim, lw.mlp, mlp);
    else
      moe.forward(proj.data(), h.data(), n, cfg, lw);
    for (size_t j = 0; j < x.size(); j++) x[j] += proj[j];
  }
  const int m = (int)logit_rows.size();
  for (int j = 0; j < m; j++)  // gather the rows in place: logit_rows ascend, so j <= row
    std::copy_n(x.data() + (size_t)logit_rows[j] * C, C, x.data() + (size_t)j * C);
  rmsnorm_forward(h.data(), rstd.data(), x.data(), w.lnf, m, C, cfg.norm_eps);
  logits.resize((size_t)m * V);
  step_matmul(logits.data(), h.data(), w.lm_head, m, C, V);
}

// Picks the next token from one row of logits; returns it and its log-prob. p and order are
// scratch (sampling only).
int32_t choose_token(const float* logits, int V, const SampleParams& sp, uint64_t& rng,
                     float* logprob, std::vector<double>& p, std::vector<int>& order) {
  const bool greedy = sp.temperature <= 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / sp.temperature;
  const SoftmaxStats st = softmax_stats(logits, V, inv_t, false);
  int32_t chosen = 0;
  if (greedy) {
    // the first id holding the largest logit: the largest probability, ties to the lower id
    while (chosen + 1 < V && !(logits[chosen] == st.max_logit)) chosen++;
  } else {
    p.resize(V);
    softmax_probs(p.data(), logits, V, inv_t, st);
    order.resize(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    int keep = sp.top_k > 0 ? std::min(sp.top_k, V) : V;
    double mass = 0.0;
    for (int i = 0; i < keep; i++) {
      mass += p[order[i]];
      if (mass >= sp.top_p) {
        keep = i + 1;
        break;
      }
    }
    double total = 0.0;
    for (int i = 0; i < keep; i++) total += p[order[i]];
    double u = next_uniform(rng) * total, acc = 0.0;
    chosen = order[keep - 1];
    for (int i = 0; i < keep; i++) {
      acc += p[order[i]];
      if (u < acc) {
        chosen = order[i];
        break;
      }
    }
  }
  *logprob = (float)st.logprob(logits, chosen, inv_t);
  return chosen;
}

}  // namespace

int decode_slots(const SampleParams& sp, int num_requests) {
  return sp.max_batch > 0 ? std::min(sp.max_batch, num_requests) : num_requests;
}

int64_t kv_cache_bytes(const ModelConfig& cfg, int slots) {
  return 2 * (int64_t)cfg.num_layers * slots * cfg.max_seq_len * kv_width(cfg) *
         (int64_t)sizeof(float);
}

uint64_t sample_seed(uint64_t campaign_seed, uint64_t iteration, uint64_t prompt_id,
                     uint64_t sample_index) {
  uint64_t s = campaign_seed;
  s ^= splitmix64(s) ^ iteration;
  s ^= splitmix64(s) ^ prompt_id;
  s ^= splitmix64(s) ^ sample_index;
  return splitmix64(s);
}

namespace {

// comm: the normal-mode communicator for the recompute path (null: KV cache only).
void generate_with(ParamStore& ps, ExpertComm* comm, MoeDecode& moe,
                   const std::vector<SampleRequest>& requests, const SampleParams& sp,
                   std::vector<SampleResult>& results, const GenerateProgress& progress) {
  const ModelConfig& cfg = ps.layout.cfg;
  const int S = (int)requests.size(), V = cfg.vocab_size;
  results.assign(S, SampleResult{});
  std::vector<uint64_t> rng(S);
  std::vector<std::vector<int32_t>> seqs(S);
  for (int s = 0; s < S; s++) {
    MOERL_CHECK_INPUT(!requests[s].prompt.empty(), "sample ", s, " has an empty prompt");
    MOERL_CHECK_INPUT((int)requests[s].prompt.size() < cfg.max_seq_len, "prompt of sample ", s,
                      " has ", requests[s].prompt.size(), " tokens; max_seq_len is ",
                      cfg.max_seq_len);
    rng[s] = requests[s].rng_seed;
    seqs[s] = requests[s].prompt;
  }
  MOERL_CHECK_INPUT(sp.max_batch >= 0, "max_batch must be >= 0 (0 = all), got ", sp.max_batch);
  const int B = decode_slots(sp, S);
  KvCache cache;
  if (sp.use_kv_cache) {
    cache.S = B;
    cache.T = cfg.max_seq_len;
    cache.C = kv_width(cfg);
    cache.k.assign(cfg.num_layers, std::vector<float>((size_t)B * cfg.max_seq_len * cache.C));
    cache.v = cache.k;
  }
  std::vector<int> fed(S, 0);       // tokens of seqs[s] already in the cache
  std::vector<int> slot_seq(B, -1);  // the sequence in each cache slot, -1 = idle
  int next = 0;                      // the first request not started yet
  std::vector<int32_t> row_seq, row_slot, row_tok, row_pos, logit_rows;
  std::vector<float> logits;
  std::vector<double> p;
  std::vector<int> order;
  Activations acts;
  int furthest = 0;        // new tokens of the furthest sample
  int64_t new_tokens = 0;  // new tokens of all samples
  for (;;) {
    row_seq.clear();
    row_slot.clear();
    row_tok.clear();
    row_pos.clear();
    logit_rows.clear();
    // an idle slot takes the next request (a fresh sequence overwrites the slot's rows from
    // position 0 and attends only to positions it has written)
    int active = 0;
    for (int b = 0; b < B; b++) {
      if (slot_seq[b] < 0 && next < S) slot_seq[b] = next++;
      active += slot_seq[b] >= 0;
    }
    // rows in slot order, each slot feeding up to `quota` of its tokens not yet in the cache:
    // a fresh prompt in one step (prefill: its rows share one pass over the weights) where the
    // MoE takes any number of rows, one token per slot where its capacity is the slot count
    // (ll) or without the KV cache
    const int quota =
        sp.use_kv_cache ? std::max(1, moe.max_rows() / std::max(1, active)) : 1;
    for (int b = 0; b < B; b++) {
      const int s = slot_seq[b];
      if (s < 0) continue;
      const int len = (int)seqs[s].size(), rows = std::min(quota, len - fed[s]);
      for (int k = 0; k < rows; k++) {
        // the row whose token completes its sequence's prefix picks the next token
        if (fed[s] + k + 1 == len) logit_rows.push_back((int32_t)row_seq.size());
        row_seq.push_back(s);
        row_slot.push_back(b);
        row_tok.push_back(seqs[s][fed[s] + k]);
        row_pos.push_back(fed[s] + k);
      }
    }
    // every rank steps until the last sequence of any rank is done (the MoE is collective)
    if (!moe.any(!row_seq.empty())) break;
    const int n = (int)row_seq.size();
    if (sp.use_kv_cache) {
      decode_step(ps, moe, cache, row_slot, row_tok, row_pos, logit_rows, logits);
    } else {
      // recompute: full forward over every active sequence's whole prefix
      int T = 0;
      for (int i = 0; i < n; i++) T = std::max(T, row_pos[i] + 1);
      std::vector<int32_t> tokens((size_t)n * T, 0), lengths(n), rows;
      for (int i = 0; i < n; i++) {
        lengths[i] = row_pos[i] + 1;
        std::copy_n(seqs[row_seq[i]].begin(), lengths[i], tokens.begin() + (size_t)i * T);
      }
      for (int i : logit_rows) rows.push_back(i * T + row_pos[i]);
      model_forward(ps, *comm, tokens.data(), lengths.data(), n, T, acts, &rows);
      logits.swap(acts.logits);
    }
    for (int i = 0, j = 0; i < n; i++) {
      int s = row_seq[i];
      fed[s]++;
      if (fed[s] < (int)seqs[s].size()) continue;  // still feeding the prompt
      float lp;
      int32_t tok = choose_token(logits.data() + (size_t)j++ * V, V, sp, rng[s], &lp, p, order);
      SampleResult& r = results[s];
      r.tokens.push_back(tok);
      r.logprobs.push_back(lp);
      seqs[s].push_back(tok);
      new_tokens++;
      furthest = std::max(furthest, (int)r.tokens.size());
      r.stopped = std::find(sp.eos_ids.begin(), sp.eos_ids.end(), tok) != sp.eos_ids.end();
      if (r.stopped || (int)r.tokens.size() >= sp.max_new_tokens ||
          (int)seqs[s].size() >= cfg.max_seq_len)
        slot_seq[row_slot[i]] = -1;  // free: the next request takes it at the next step
    }
    if (progress) progress(furthest, new_tokens);
  }
}

}  // namespace

void generate(ParamStore& ps, ExpertComm& comm, const std::vector<SampleRequest>& requests,
              const SampleParams& sp, std::vector<SampleResult>& results,
              const GenerateProgress& progress) {
  NormalMoeDecode moe(comm);
  generate_with(ps, &comm, moe, requests, sp, results, progress);
}

void generate(ParamStore& ps, MoeDecode& moe, const std::vector<SampleRequest>& requests,
              const SampleParams& sp, std::vector<SampleResult>& results,
              const GenerateProgress& progress) {
  MOERL_CHECK_INPUT(sp.use_kv_cache, "expert-parallel generation (", moe.name(),
                    ") needs the KV cache: drop --no-kv-cache");
  generate_with(ps, nullptr, moe, requests, sp, results, progress);
}

}  // namespace moerl::model
