// MoE block forward/backward. Routing: softmax over E router logits, top-k by probability
// (ties to the lower expert id), weights renormalised over the chosen k unless the config says
// not (norm_topk_prob). Balance loss, by the config's BalanceLoss: sequence-wise (as in
// DeepSeek-V3): aux_b = E * sum_e f_e P_e with f_e the fraction of the sequence's (token, slot)
// picks going to e and P_e its mean router probability, so a batch split across ranks by
// sequences gives exactly the single-rank loss; or batch-wise as transformers computes it, from
// the pick and probability sums this block records (model.cc adds them over layers and ranks).
#include "model/moe.h"

#include <algorithm>  // std::fill
#include <cmath>      // std::exp, std::log

#include "common/check.h"
#include "model/ops.h"

namespace moerl::model {
namespace {

bool token_valid(const SeqInfo& seq, int i) {
  return seq.lengths != nullptr && (i % seq.T) < seq.lengths[i / seq.T];
}

}  // namespace

void swiglu_mlp_forward(float* y, const float* x, int n, int C, int F, const ExpertWeights& w,
                        MlpActs& acts) {
  acts.h1.resize((size_t)n * F);
  acts.h3.resize((size_t)n * F);
  acts.act.resize((size_t)n * F);
  if (n == 0) return;
  matmul_forward(acts.h1.data(), x, w.w1, n, C, F);  // [n,F]
  matmul_forward(acts.h3.data(), x, w.w3, n, C, F);  // [n,F]
  swiglu_forward(acts.act.data(), acts.h1.data(), acts.h3.data(), n * F);
  matmul_forward(y, acts.act.data(), w.w2, n, F, C);  // [n,C]
}

void swiglu_mlp_backward(float* dx, const ExpertWeights& dw, const float* dy, const float* x, int n,
                         int C, int F, const ExpertWeights& w, const MlpActs& acts) {
  if (n == 0) return;
  std::vector<float> dact((size_t)n * F, 0.0f), dh1((size_t)n * F, 0.0f), dh3((size_t)n * F, 0.0f);
  matmul_backward(dact.data(), dw.w2, dy, acts.act.data(), w.w2, n, F, C);
  swiglu_backward(dh1.data(), dh3.data(), dact.data(), acts.h1.data(), acts.h3.data(), n * F);
  matmul_backward(dx, dw.w1, dh1.data(), x, w.w1, n, C, F);
  matmul_backward(dx, dw.w3, dh3.data(), x, w.w3, n, C, F);
}

void moe_route(const float* inp, int N, const ModelConfig& cfg, const LayerWeights& lw,
               MoeActs& a) {
  const int C = cfg.dim, E = cfg.num_experts, K = cfg.top_k;

  // router: logits [N,E] -> probs, logsumexp for the z-loss
  a.logits.resize((size_t)N * E);
  matmul_forward(a.logits.data(), inp, lw.router, N, C, E);
  a.probs = a.logits;
  a.lse.resize(N);
  for (int i = 0; i < N; i++) {
    const float* l = a.logits.data() + (size_t)i * E;
    float m = l[0];
    for (int e = 1; e < E; e++) m = std::max(m, l[e]);
    double s = 0.0;
    for (int e = 0; e < E; e++) s += std::exp((double)(l[e] - m));
    a.lse[i] = (float)(m + std::log(s));
  }
  softmax_rows(a.probs.data(), N, E);

  // top-k selection and renormalised weights
  a.topk_idx.resize((size_t)N * K);
  a.topk_w.resize((size_t)N * K);
  a.expert_load.assign(E, 0);
  for (int i = 0; i < N; i++) {
    const float* p = a.probs.data() + (size_t)i * E;
    int32_t* idx = a.topk_idx.data() + (size_t)i * K;
    float* w = a.topk_w.data() + (size_t)i * K;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int j = 0; j < k; j++) taken |= idx[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      idx[k] = best;
      sum += p[best];
    }
    const float norm = cfg.norm_topk_prob ? sum : 1.0f;
    for (int k = 0; k < K; k++) {
      w[k] = p[idx[k]] / norm;
      a.expert_load[idx[k]]++;
    }
  }
}

void moe_forward(float* out, const float* inp, int N, const ModelConfig& cfg,
                 const LayerWeights& lw, const SeqInfo& seq, ExpertComm& comm, MoeActs& a) {
  const int C = cfg.dim, E = cfg.num_experts, K = cfg.top_k, F = cfg.expert_dim;

  moe_route(inp, N, cfg, lw, a);

  // losses for metrics (gradients in backward)
  a.aux_sum = 0.0;
  a.z_sum = 0.0;
  a.pick_count.assign(E, 0.0);
  a.prob_sum.assign(E, 0.0);
  a.valid_tokens = 0.0;
  if (seq.lengths != nullptr && cfg.balance_loss == BalanceLoss::Batch) {
    for (int i = 0; i < N; i++) {
      if (!token_valid(seq, i)) continue;
      a.valid_tokens += 1.0;
      for (int k = 0; k < K; k++) a.pick_count[a.topk_idx[(size_t)i * K + k]] += 1.0;
      for (int e = 0; e < E; e++) a.prob_sum[e] += a.probs[(size_t)i * E + e];
      a.z_sum += (double)a.lse[i] * a.lse[i];
    }
  } else if (seq.lengths != nullptr) {
    std::vector<double> f(E), P(E);
    for (int b = 0; b < seq.B; b++) {
      int Tb = seq.lengths[b];
      if (Tb == 0) continue;
      std::fill(f.begin(), f.end(), 0.0);
      std::fill(P.begin(), P.end(), 0.0);
      for (int t = 0; t < Tb; t++) {
        int i = b * seq.T + t;
        for (int k = 0; k < K; k++) f[a.topk_idx[(size_t)i * K + k]] += 1.0 / ((double)K * Tb);
        for (int e = 0; e < E; e++) P[e] += a.probs[(size_t)i * E + e] / Tb;
        a.z_sum += (double)a.lse[i] * a.lse[i];
      }
      double aux = 0.0;
      for (int e = 0; e < E; e++) aux += f[e] * P[e];
      a.aux_sum += E * aux;
    }
  }

  // dispatch to the experts' ranks
  comm.dispatch(inp, N, C, a.topk_idx.data(), a.topk_w.data(), K, a.recv);
  const int Nr = a.recv.num_recv;
  const int NL = comm.num_local_experts();

  // group (row, slot) pairs by local expert, rows ascending within an expert
  a.offsets.assign(NL + 1, 0);
  for (size_t j = 0; j < a.recv.idx.size(); j++)
    if (a.recv.idx[j] >= 0) a.offsets[a.recv.idx[j] + 1]++;
  for (int e = 0; e < NL; e++) a.offsets[e + 1] += a.offsets[e];
  const int P = a.offsets[NL];
  a.pair_row.resize(P);
  a.pair_slot.resize(P);
  {
    std::vector<int32_t> fill(a.offsets.begin(), a.offsets.end() - 1);
    for (int r = 0; r < Nr; r++)
      for (int k = 0; k < K; k++) {
        int e = a.recv.idx[(size_t)r * K + k];
        if (e < 0) continue;
        int p = fill[e]++;
        a.pair_row[p] = r;
        a.pair_slot[p] = k;
      }
  }

  // experts: y = W2 (silu(W1 x) * W3 x), one GEMM chain per local expert
  a.xin.resize((size_t)P * C);
  a.y.resize((size_t)P * C);
  a.expert_acts.resize(NL);
  for (int p = 0; p < P; p++)
    std::copy_n(a.recv.x() + (size_t)a.pair_row[p] * C, C, a.xin.data() + (size_t)p * C);
  for (int e = 0; e < NL; e++) {
    int p0 = a.offsets[e], n = a.offsets[e + 1] - p0;
    swiglu_mlp_forward(a.y.data() + (size_t)p0 * C, a.xin.data() + (size_t)p0 * C, n, C, F,
                       lw.experts[e], a.expert_acts[e]);
  }
  a.recv_out.assign((size_t)Nr * C, 0.0f);
  for (int p = 0; p < P; p++) {
    int r = a.pair_row[p];
    float w = a.recv.w()[(size_t)r * K + a.pair_slot[p]];
    float* o = a.recv_out.data() + (size_t)r * C;
    const float* y = a.y.data() + (size_t)p * C;
    for (int c = 0; c < C; c++) o[c] += w * y[c];
  }

  // combine back to the tokens' rank
  comm.combine(a.recv_out.data(), C, a.recv, out);
}

void moe_backward(float* dinp, const LayerWeights& dlw, const float* dout, const float* inp,
                  int N, const ModelConfig& cfg, const LayerWeights& lw, const SeqInfo& seq,
                  float aux_weight, float z_weight, ExpertComm& comm, MoeActs& a) {
  const int C = cfg.dim, E = cfg.num_experts, K = cfg.top_k, F = cfg.expert_dim;
  const int Nr = a.recv.num_recv;
  const int NL = comm.num_local_experts();
  const int P = a.offsets[NL];

  // backward of combine = dispatch along the cached routes
  std::vector<float> drecv_out;
  comm.dispatch_cached(dout, C, a.recv, drecv_out);

  // weighted sum -> per-pair dy and per-slot weight gradients
  std::vector<float> dy((size_t)P * C), drecv_w((size_t)Nr * K, 0.0f);
  for (int p = 0; p < P; p++) {
    int r = a.pair_row[p], k = a.pair_slot[p];
    float w = a.recv.w()[(size_t)r * K + k];
    const float* d = drecv_out.data() + (size_t)r * C;
    const float* y = a.y.data() + (size_t)p * C;
    float* g = dy.data() + (size_t)p * C;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < C; c++) {
      g[c] = w * d[c];
      dot += d[c] * y[c];
    }
    drecv_w[(size_t)r * K + k] = dot;
  }

  // experts backward
  std::vector<float> dxin((size_t)P * C, 0.0f);
  for (int e = 0; e < NL; e++) {
    int p0 = a.offsets[e], n = a.offsets[e + 1] - p0;
    size_t oc = (size_t)p0 * C;
    swiglu_mlp_backward(dxin.data() + oc, dlw.experts[e], dy.data() + oc, a.xin.data() + oc, n, C,
                        F, lw.experts[e], a.expert_acts[e]);
  }
  std::vector<float> drecv_x((size_t)Nr * C, 0.0f);
  for (int p = 0; p < P; p++) {
    float* d = drecv_x.data() + (size_t)a.pair_row[p] * C;
    const float* g = dxin.data() + (size_t)p * C;
    for (int c = 0; c < C; c++) d[c] += g[c];
  }

  // backward of dispatch = combine: token-row gradients and per-slot weight gradients
  std::vector<float> dx_experts((size_t)N * C), dtopk_w((size_t)N * K);
  comm.combine(drecv_x.data(), C, a.recv, dx_experts.data());
  comm.combine(drecv_w.data(), K, a.recv, dtopk_w.data());
  for (size_t j = 0; j < dx_experts.size(); j++) dinp[j] += dx_experts[j];

  // router: renormalised top-k weights, balance loss, softmax, z-loss
  std::vector<float> dprobs((size_t)N * E, 0.0f);
  for (int i = 0; i < N; i++) {
    const int32_t* idx = a.topk_idx.data() + (size_t)i * K;
    const float* w = a.topk_w.data() + (size_t)i * K;
    const float* dw = dtopk_w.data() + (size_t)i * K;
    const float* p = a.probs.data() + (size_t)i * E;
    float S = 0.0f, wdw = 0.0f;
    for (int k = 0; k < K; k++) {
      S += p[idx[k]];
      wdw += w[k] * dw[k];
    }
    for (int k = 0; k < K; k++)
      dprobs[(size_t)i * E + idx[k]] += cfg.norm_topk_prob ? (dw[k] - wdw) / S : dw[k];
  }
  if (seq.lengths != nullptr && aux_weight != 0.0f && cfg.balance_loss == BalanceLoss::Batch) {
    MOERL_CHECK(a.balance_grad.size() == (size_t)E, "batch balance loss: no gradient was set");
    for (int i = 0; i < N; i++) {
      if (!token_valid(seq, i)) continue;
      float* dp = dprobs.data() + (size_t)i * E;
      for (int e = 0; e < E; e++) dp[e] += aux_weight * a.balance_grad[e];
    }
  } else if (seq.lengths != nullptr && aux_weight != 0.0f) {
    std::vector<float> f(E);
    for (int b = 0; b < seq.B; b++) {
      int Tb = seq.lengths[b];
      if (Tb == 0) continue;
      std::fill(f.begin(), f.end(), 0.0f);
      for (int t = 0; t < Tb; t++)
        for (int k = 0; k < K; k++) f[a.topk_idx[((size_t)b * seq.T + t) * K + k]] += 1.0f;
      for (int t = 0; t < Tb; t++) {
        float* dp = dprobs.data() + ((size_t)b * seq.T + t) * E;
        // d/dp_t[e] of aux_weight * E * sum_e (count_e / (K Tb)) * (sum_t p_t[e] / Tb)
        for (int e = 0; e < E; e++)
          dp[e] += aux_weight * E * f[e] / ((float)K * Tb * Tb);
      }
    }
  }
  std::vector<float> dlogits((size_t)N * E);
  for (int i = 0; i < N; i++) {
    const float* p = a.probs.data() + (size_t)i * E;
    const float* dp = dprobs.data() + (size_t)i * E;
    float* dl = dlogits.data() + (size_t)i * E;
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
    float zg = token_valid(seq, i) ? z_weight * 2.0f * a.lse[i] : 0.0f;
    for (int e = 0; e < E; e++) dl[e] = p[e] * (dp[e] - pdp) + zg * p[e];
  }
  matmul_backward(dinp, dlw.router, dlogits.data(), inp, lw.router, N, C, E);
}

}  // namespace moerl::model
