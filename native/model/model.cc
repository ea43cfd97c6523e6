// Model forward/backward: the backward calls the ops in exactly the reverse order.
#include "model/model.h"

#include <algorithm>  // std::fill, std::copy_n, std::swap

#include "common/check.h"
#include "model/ops.h"

namespace moerl::model {

void qk_norm_forward(float* qkv, float* rstd, const float* qkv_raw, const LayerWeights& lw, int N,
                     const ModelConfig& cfg) {
  const int W = qkv_width(cfg), Q = q_width(cfg), H = cfg.num_heads, Hkv = kv_heads(cfg),
            D = head_dim(cfg);
  for (int i = 0; i < N; i++) {
    const float* x = qkv_raw + (size_t)i * W;
    float* y = qkv + (size_t)i * W;
    float* r = rstd + (size_t)i * (H + Hkv);
    rmsnorm_forward(y, r, x, lw.q_norm, H, D, cfg.norm_eps);
    rmsnorm_forward(y + Q, r + H, x + Q, lw.k_norm, Hkv, D, cfg.norm_eps);
    std::copy_n(x + Q + Hkv * D, Hkv * D, y + Q + Hkv * D);
  }
}

void qk_norm_backward(float* dqkv_raw, const LayerWeights& dlw, const float* dqkv,
                      const float* qkv_raw, const float* rstd, const LayerWeights& lw, int N,
                      const ModelConfig& cfg) {
  const int W = qkv_width(cfg), Q = q_width(cfg), H = cfg.num_heads, Hkv = kv_heads(cfg),
            D = head_dim(cfg);
  for (int i = 0; i < N; i++) {
    const float* x = qkv_raw + (size_t)i * W;
    const float* dy = dqkv + (size_t)i * W;
    float* dx = dqkv_raw + (size_t)i * W;
    const float* r = rstd + (size_t)i * (H + Hkv);
    rmsnorm_backward(dx, dlw.q_norm, dy, x, lw.q_norm, r, H, D);
    rmsnorm_backward(dx + Q, dlw.k_norm, dy + Q, x + Q, lw.k_norm, r + H, Hkv, D);
    for (int c = Q + Hkv * D; c < W; c++) dx[c] += dy[c];
  }
}

namespace {

// BalanceLoss::Batch: transformers' load_balancing_loss_func over the MoE layers of this forward
// on all ranks, aux = E * sum_e (c_e / M) (S_e / M) with c_e the picks of expert e, S_e the sum
// of its router probabilities and M the valid tokens, all summed over layers and ranks. Sets
// every MoE layer's balance_grad = d aux / d p = E c_e / M^2 and returns aux (collective).
double batch_balance_loss(const ModelConfig& cfg, ExpertComm& comm, std::vector<LayerActs>& layers) {
  const int E = cfg.num_experts;
  std::vector<float> sums(2 * E + 1, 0.0f);  // c [E] | S [E] | M
  std::vector<double> local(2 * E + 1, 0.0);
  for (int l = 0; l < cfg.num_layers; l++) {
    if (is_dense_layer(cfg, l)) continue;
    const MoeActs& m = layers[l].moe;
    for (int e = 0; e < E; e++) {
      local[e] += m.pick_count[e];
      local[E + e] += m.prob_sum[e];
    }
    local[2 * E] += m.valid_tokens;
  }
  for (size_t j = 0; j < sums.size(); j++) sums[j] = (float)local[j];
  comm.allreduce_sum(sums.data(), sums.size());
  const double M = sums[2 * E];
  double aux = 0.0;
  std::vector<float> grad(E, 0.0f);
  if (M > 0.0) {
    for (int e = 0; e < E; e++) {
      aux += (double)sums[e] * sums[E + e];
      grad[e] = (float)(E * (double)sums[e] / (M * M));
    }
    aux *= E / (M * M);
  }
  for (int l = 0; l < cfg.num_layers; l++)
    if (!is_dense_layer(cfg, l)) layers[l].moe.balance_grad = grad;
  return aux;
}

}  // namespace

void model_forward(ParamStore& ps, ExpertComm& comm, const int32_t* tokens,
                   const int32_t* lengths, int B, int T, Activations& a,
                   const std::vector<int32_t>* logit_rows) {
  const ModelConfig& cfg = ps.layout.cfg;
  const int C = cfg.dim, V = cfg.vocab_size, H = cfg.num_heads, N = B * T;
  const int Hkv = kv_heads(cfg), D = head_dim(cfg), W = qkv_width(cfg), Q = q_width(cfg);
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
    la.qkv.resize((size_t)N * W);
    la.att_probs.resize((size_t)B * H * T * T);
    la.att.resize((size_t)N * Q);
    la.ln2.resize((size_t)N * C);
    la.ln2_rstd.resize(N);
    rmsnorm_forward(la.ln1.data(), la.ln1_rstd.data(), la.resid.data(), lw.ln1, N, C, cfg.norm_eps);
    if (cfg.qk_norm) {
      la.qkv_raw.resize((size_t)N * W);
      la.qk_rstd.resize((size_t)N * (H + Hkv));
      matmul_forward(la.qkv_raw.data(), la.ln1.data(), lw.wqkv, N, C, W);
      qk_norm_forward(la.qkv.data(), la.qk_rstd.data(), la.qkv_raw.data(), lw, N, cfg);
    } else {
      matmul_forward(la.qkv.data(), la.ln1.data(), lw.wqkv, N, C, W);
    }
    if (cfg.rope_theta > 0.0f)
      rope_forward(la.qkv.data(), a.positions.data(), N, W, H + Hkv, D, cfg.rope_theta);
    attention_forward(la.att.data(), la.att_probs.data(), la.qkv.data(), B, T, H, Hkv, D);
    std::vector<float> proj((size_t)N * C);
    matmul_forward(proj.data(), la.att.data(), lw.wo, N, Q, C);
    la.mid = la.resid;
    for (size_t j = 0; j < la.mid.size(); j++) la.mid[j] += proj[j];
    rmsnorm_forward(la.ln2.data(), la.ln2_rstd.data(), la.mid.data(), lw.ln2, N, C, cfg.norm_eps);
    if (is_dense_layer(cfg, l)) {
      swiglu_mlp_forward(proj.data(), la.ln2.data(), N, C, cfg.dense_dim, lw.mlp, la.mlp);
      la.moe.expert_load.assign(cfg.num_experts, 0);
    } else {
      moe_forward(proj.data(), la.ln2.data(), N, cfg, lw, seq, comm, la.moe);
    }
    for (size_t j = 0; j < x.size(); j++) x[j] = la.mid[j] + proj[j];
    a.aux_sum += la.moe.aux_sum;
    a.z_sum += la.moe.z_sum;
    for (int e = 0; e < cfg.num_experts; e++) a.expert_load[e] += la.moe.expert_load[e];
  }
  if (cfg.balance_loss == BalanceLoss::Batch) a.aux_sum = batch_balance_loss(cfg, comm, a.layers);
  a.resid_final = x;
  a.lnf.resize((size_t)N * C);
  a.lnf_rstd.resize(N);
  rmsnorm_forward(a.lnf.data(), a.lnf_rstd.data(), a.resid_final.data(), w.lnf, N, C, cfg.norm_eps);
  a.all_logit_rows = logit_rows == nullptr;
  const float* head_in = a.lnf.data();
  int M = N;
  if (!a.all_logit_rows) {
    a.logit_rows = *logit_rows;
    M = (int)a.logit_rows.size();
    a.lnf_rows.resize((size_t)M * C);
    for (int j = 0; j < M; j++) {
      const int r = a.logit_rows[j];
      MOERL_CHECK(r >= 0 && r < N, "logit row ", r, " outside the batch's ", N, " rows");
      std::copy_n(a.lnf.data() + (size_t)r * C, C, a.lnf_rows.data() + (size_t)j * C);
    }
    head_in = a.lnf_rows.data();
  }
  a.logits.resize((size_t)M * V);
  matmul_forward(a.logits.data(), head_in, w.lm_head, M, C, V);
}

void model_backward(ParamStore& ps, ExpertComm& comm, const float* dlogits, float aux_weight,
                    float z_weight, Activations& a) {
  const ModelConfig& cfg = ps.layout.cfg;
  const int C = cfg.dim, V = cfg.vocab_size, H = cfg.num_heads, B = a.B, T = a.T, N = B * T;
  const int Hkv = kv_heads(cfg), D = head_dim(cfg), W = qkv_width(cfg), Q = q_width(cfg);
  const Weights& w = ps.w;
  const Weights& dw = ps.dw;
  SeqInfo seq{B, T, a.lengths.data()};

  std::vector<float> dlnf((size_t)N * C, 0.0f), dx((size_t)N * C, 0.0f);
  if (a.all_logit_rows) {
    matmul_backward(dlnf.data(), dw.lm_head, dlogits, a.lnf.data(), w.lm_head, N, C, V);
  } else {
    const int M = (int)a.logit_rows.size();
    std::vector<float> dlnf_rows((size_t)M * C, 0.0f);
    matmul_backward(dlnf_rows.data(), dw.lm_head, dlogits, a.lnf_rows.data(), w.lm_head, M, C, V);
    for (int j = 0; j < M; j++) {
      float* d = dlnf.data() + (size_t)a.logit_rows[j] * C;
      const float* g = dlnf_rows.data() + (size_t)j * C;
      for (int c = 0; c < C; c++) d[c] += g[c];
    }
  }
  rmsnorm_backward(dx.data(), dw.lnf, dlnf.data(), a.resid_final.data(), w.lnf,
                   a.lnf_rstd.data(), N, C);
  std::vector<float> dmid((size_t)N * C), dln((size_t)N * C), datt((size_t)N * Q),
      dqkv((size_t)N * W), dqkv_raw;
  for (int l = cfg.num_layers - 1; l >= 0; l--) {
    LayerActs& la = a.layers[l];
    const LayerWeights& lw = w.layers[l];
    const LayerWeights& dlw = dw.layers[l];
    // x = mid + mlp(ln2(mid)), the MLP a MoE or dense
    dmid = dx;
    std::fill(dln.begin(), dln.end(), 0.0f);
    if (is_dense_layer(cfg, l)) {
      swiglu_mlp_backward(dln.data(), dlw.mlp, dx.data(), la.ln2.data(), N, C, cfg.dense_dim,
                          lw.mlp, la.mlp);
    } else {
      moe_backward(dln.data(), dlw, dx.data(), la.ln2.data(), N, cfg, lw, seq, aux_weight,
                   z_weight, comm, la.moe);
    }
    rmsnorm_backward(dmid.data(), dlw.ln2, dln.data(), la.mid.data(), lw.ln2, la.ln2_rstd.data(),
                     N, C);
    // mid = resid + wo(att(rope(qk_norm(qkv(ln1(resid))))))
    dx = dmid;
    std::fill(datt.begin(), datt.end(), 0.0f);
    std::fill(dqkv.begin(), dqkv.end(), 0.0f);
    std::fill(dln.begin(), dln.end(), 0.0f);
    matmul_backward(datt.data(), dlw.wo, dmid.data(), la.att.data(), lw.wo, N, Q, C);
    attention_backward(dqkv.data(), datt.data(), la.qkv.data(), la.att_probs.data(), B, T, H, Hkv,
                       D);
    if (cfg.rope_theta > 0.0f)
      rope_backward(dqkv.data(), a.positions.data(), N, W, H + Hkv, D, cfg.rope_theta);
    if (cfg.qk_norm) {
      dqkv_raw.assign((size_t)N * W, 0.0f);
      qk_norm_backward(dqkv_raw.data(), dlw, dqkv.data(), la.qkv_raw.data(), la.qk_rstd.data(), lw,
                       N, cfg);
      std::swap(dqkv, dqkv_raw);
    }
    matmul_backward(dln.data(), dlw.wqkv, dqkv.data(), la.ln1.data(), lw.wqkv, N, C, W);
    rmsnorm_backward(dx.data(), dlw.ln1, dln.data(), la.resid.data(), lw.ln1, la.ln1_rstd.data(),
                     N, C);
  }
  embedding_backward(dw.wte, dw.wpe, dx.data(), a.tokens.data(), a.positions.data(), N, C,
                     cfg.pad_token_id);
}

double forward_flops(const ModelConfig& cfg, int B, int T) {
  const double N = (double)B * T, C = cfg.dim, F = cfg.expert_dim, E = cfg.num_experts;
  const double W = qkv_width(cfg), Q = q_width(cfg);
  double attention = 2.0 * N * C * W                                  // qkv
                     + 2.0 * 2.0 * B * (T * (T + 1) / 2.0) * Q        // causal scores + values
                     + 2.0 * N * Q * C;                               // output projection
  double moe = 2.0 * N * C * E                                        // router
               + 2.0 * N * cfg.top_k * 3 * C * F;                     // the K applied experts
  double dense = 2.0 * N * 3 * C * cfg.dense_dim;
  return cfg.num_layers * attention + num_moe_layers(cfg) * moe +
         (double)cfg.dense_layers.size() * dense + 2.0 * N * C * cfg.vocab_size;
}

}  // namespace moerl::model
