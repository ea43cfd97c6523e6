// Model forward/backward: the backward calls the ops in exactly the reverse order.
#include "model/model.h"

#include <algorithm>  // std::fill

#include "common/check.h"
#include "model/ops.h"

namespace moerl::model {

void model_forward(ParamStore& ps, ExpertComm& comm, const int32_t* tokens,
                   const int32_t* lengths, int B, int T, Activations& a) {
  const ModelConfig& cfg = ps.layout.cfg;
  const int C = cfg.dim, V = cfg.vocab_size, H = cfg.num_heads, N = B * T;
  MOERL_CHECK_INPUT(T <= cfg.max_seq_len, "sequence length ", T, " exceeds max_seq_len ",
                    cfg.max_seq_len);
  for (int i = 0; i < N; i++)
    MOERL_CHECK_INPUT(tokens[i] >= 0 && tokens[i] < V, "token id ", tokens[i],
                      " outside vocab of ", V);
  const Weights& w = ps.w;
  a.B = B;
  a.T = T;
  a.tokens.assign(tokens, tokens + N);
  a.lengths.assign(lengths, lengths + B);
  a.positions.resize(N);
  for (int i = 0; i < N; i++) a.positions[i] = i % T;
  SeqInfo seq{B, T, a.lengths.data()};

  a.layers.resize(cfg.num_layers);
  std::vector<float> x((size_t)N * C);
  embedding_forward(x.data(), a.tokens.data(), a.positions.data(), w.wte, w.wpe, N, C);
  a.aux_sum = a.z_sum = 0.0;
  a.expert_load.assign(cfg.num_experts, 0);
  for (int l = 0; l < cfg.num_layers; l++) {
    LayerActs& la = a.layers[l];
    const LayerWeights& lw = w.layers[l];
    la.resid = x;
    la.ln1.resize((size_t)N * C);
    la.ln1_rstd.resize(N);
    la.qkv.resize((size_t)N * 3 * C);
    la.att_probs.resize((size_t)B * H * T * T);
    la.att.resize((size_t)N * C);
    la.ln2.resize((size_t)N * C);
    la.ln2_rstd.resize(N);
    rmsnorm_forward(la.ln1.data(), la.ln1_rstd.data(), la.resid.data(), lw.ln1, N, C, cfg.norm_eps);
    matmul_forward(la.qkv.data(), la.ln1.data(), lw.wqkv, N, C, 3 * C);
    attention_forward(la.att.data(), la.att_probs.data(), la.qkv.data(), B, T, C, H);
    std::vector<float> proj((size_t)N * C);
    matmul_forward(proj.data(), la.att.data(), lw.wo, N, C, C);
    la.mid = la.resid;
    for (size_t j = 0; j < la.mid.size(); j++) la.mid[j] += proj[j];
    rmsnorm_forward(la.ln2.data(), la.ln2_rstd.data(), la.mid.data(), lw.ln2, N, C, cfg.norm_eps);
    moe_forward(proj.data(), la.ln2.data(), N, cfg, lw, seq, comm, la.moe);
    for (size_t j = 0; j < x.size(); j++) x[j] = la.mid[j] + proj[j];
    a.aux_sum += la.moe.aux_sum;
    a.z_sum += la.moe.z_sum;
    for (int e = 0; e < cfg.num_experts; e++) a.expert_load[e] += la.moe.expert_load[e];
  }
  a.resid_final = x;
  a.lnf.resize((size_t)N * C);
  a.lnf_rstd.resize(N);
  rmsnorm_forward(a.lnf.data(), a.lnf_rstd.data(), a.resid_final.data(), w.lnf, N, C, cfg.norm_eps);
  a.logits.resize((size_t)N * V);
  matmul_forward(a.logits.data(), a.lnf.data(), w.lm_head, N, C, V);
}

void model_backward(ParamStore& ps, ExpertComm& comm, const float* dlogits, float aux_weight,
                    float z_weight, Activations& a) {
  const ModelConfig& cfg = ps.layout.cfg;
  const int C = cfg.dim, V = cfg.vocab_size, H = cfg.num_heads, B = a.B, T = a.T, N = B * T;
  const Weights& w = ps.w;
  const Weights& dw = ps.dw;
  SeqInfo seq{B, T, a.lengths.data()};

  std::vector<float> dlnf((size_t)N * C, 0.0f), dx((size_t)N * C, 0.0f);
  matmul_backward(dlnf.data(), dw.lm_head, dlogits, a.lnf.data(), w.lm_head, N, C, V);
  rmsnorm_backward(dx.data(), dw.lnf, dlnf.data(), a.resid_final.data(), w.lnf,
                   a.lnf_rstd.data(), N, C);
  std::vector<float> dmid((size_t)N * C), dln((size_t)N * C), datt((size_t)N * C),
      dqkv((size_t)N * 3 * C);
  for (int l = cfg.num_layers - 1; l >= 0; l--) {
    LayerActs& la = a.layers[l];
    const LayerWeights& lw = w.layers[l];
    const LayerWeights& dlw = dw.layers[l];
    // x = mid + moe(ln2(mid))
    dmid = dx;
    std::fill(dln.begin(), dln.end(), 0.0f);
    moe_backward(dln.data(), dlw, dx.data(), la.ln2.data(), N, cfg, lw, seq, aux_weight, z_weight,
                 comm, la.moe);
    rmsnorm_backward(dmid.data(), dlw.ln2, dln.data(), la.mid.data(), lw.ln2, la.ln2_rstd.data(),
                     N, C);
    // mid = resid + wo(att(qkv(ln1(resid))))
    dx = dmid;
    std::fill(datt.begin(), datt.end(), 0.0f);
    std::fill(dqkv.begin(), dqkv.end(), 0.0f);
    std::fill(dln.begin(), dln.end(), 0.0f);
    matmul_backward(datt.data(), dlw.wo, dmid.data(), la.att.data(), lw.wo, N, C, C);
    attention_backward(dqkv.data(), datt.data(), la.qkv.data(), la.att_probs.data(), B, T, C, H);
    matmul_backward(dln.data(), dlw.wqkv, dqkv.data(), la.ln1.data(), lw.wqkv, N, C, 3 * C);
    rmsnorm_backward(dx.data(), dlw.ln1, dln.data(), la.resid.data(), lw.ln1, la.ln1_rstd.data(),
                     N, C);
  }
  embedding_backward(dw.wte, dw.wpe, dx.data(), a.tokens.data(), a.positions.data(), N, C);
}

double forward_flops(const ModelConfig& cfg, int B, int T) {
  const double N = (double)B * T, C = cfg.dim, F = cfg.expert_dim, E = cfg.num_experts;
  double per_layer = 2.0 * N * C * 3 * C      // qkv
                     + 2.0 * 2.0 * B * (T * (T + 1) / 2.0) * C  // causal scores + weighted values
                     + 2.0 * N * C * C        // output projection
                     + 2.0 * N * C * E        // router
                     + 2.0 * N * cfg.top_k * 3 * C * F;  // experts
  return cfg.num_layers * per_layer + 2.0 * N * C * cfg.vocab_size;
}

}  // namespace moerl::model
