// Layer ops of the MoE policy, forward and backward side by side (after llm.c).
// Every backward *adds* into its gradient outputs, so a tensor used twice simply
// receives both contributions. Dimension letters: N rows (tokens), C model width,
// OC/IC output/input channels, B sequences, T positions, H heads, F expert width.
#pragma once

#include <cstdint>  // int32_t token ids

namespace moerl::model {

// out [N,OC] = inp [N,IC] @ weight[OC,IC]^T: OpenBLAS sgemm, or for N <= kSmallMatmulRows the
// few-row kernel (kernels.h), which streams a weight from memory once instead of packing it
// first: a decode step's experts see ~8 rows each (1.4x faster than sgemm there, measured), and
// a row's result then does not depend on the others.
constexpr int kSmallMatmulRows = 32;
void matmul_forward(float* out, const float* inp, const float* weight, int N, int IC, int OC);
// dinp [N,IC] += dout @ weight;  dweight [OC,IC] += dout^T @ inp. Either output may be null.
void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

// out [N,C] = inp / sqrt(mean(inp^2) + eps) * weight [C];  rstd [N] saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

// out [B*T,H*D] = causal softmax(q k^T / sqrt(D)) v per sequence and head; query head h reads
// kv head h / (H / Hkv) (grouped-query attention; Hkv = H is multi-head attention).
// qkv [B*T,W] rows hold q (H heads) | k (Hkv heads) | v (Hkv heads), W = (H + 2 Hkv) D;
// probs [B,H,T,T] saved for backward (upper triangle zero). GEMMs per sequence and head.
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int H, int Hkv,
                       int D);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                        int B, int T, int H, int Hkv, int D);

// RoPE in transformers' rotate-half convention, in place on the first `heads` heads of D
// channels of each of N rows (row i starts at i * stride, rotated by angle positions[i] * f_j,
// f_j = theta^(-2j/D)): (x_j, x_{j+D/2}) -> (x_j cos - x_{j+D/2} sin, x_{j+D/2} cos + x_j sin).
void rope_forward(float* x, const int32_t* positions, int N, int stride, int heads, int D,
                  float theta);
// dx (same layout) in place: the gradient before the rotation from the gradient after it.
void rope_backward(float* dx, const int32_t* positions, int N, int stride, int heads, int D,
                   float theta);
// cos and sin [D/2] of the angles of one position.
void rope_angles(float* cos_out, float* sin_out, int position, int D, float theta);

// act [n,F] = silu(h1) * h3  (SwiGLU gate; kernels.h, the sigmoid from an fp32 exp within 2 ulp)
void swiglu_forward(float* act, const float* h1, const float* h3, int n);
void swiglu_backward(float* dh1, float* dh3, const float* dact, const float* h1, const float* h3,
                     int n);

// out [N,C] = wte[tokens] + wpe[positions] (wpe may be null: no position embedding)
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int N, int C);
// skip_token: a token id whose row of dwte gets nothing (-1 = none).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int N, int C, int skip_token = -1);

// Row-wise softmax in place over [N,V]; returns nothing, rows are independent.
void softmax_rows(float* x, int N, int V);

// Log-softmax of one row of logits [V] at a temperature, z = logits * inv_tau, as trainer,
// sampler and scoring share it: in fp64 from the fp32 logits (exp within 5 ulp, vec.h), the
// sums over 8 fixed lanes, so the bits do not depend on the vector width (kernels.h). A NaN
// among the logits makes log_sum NaN.
struct SoftmaxStats {
  float max_logit = 0.0f;  // max_v logits_v
  double log_sum = 0.0;    // log sum_v exp(d_v), d_v = (logits_v - max_logit) * inv_tau
  double entropy = 0.0;    // -sum_v p_v log p_v, when asked for
  // log p_v of one token, d_v in fp64 (exact but for one rounding): the log-prob of an
  // unlikely token keeps its digits
  double logprob(const float* logits, int v, float inv_tau) const {
    return ((double)logits[v] - max_logit) * inv_tau - log_sum;
  }
};
SoftmaxStats softmax_stats(const float* logits, int V, float inv_tau, bool with_entropy);
// p [V] = softmax(logits * inv_tau) from the row's stats.
void softmax_probs(double* p, const float* logits, int V, float inv_tau, const SoftmaxStats& st);
// dlogits [V] = scale * d(d_logp * log p_target + d_entropy * H) / d logits, written (not
// added); dlogits may be logits itself (the LM head's output row turned into its gradient).
// d_entropy != 0 needs stats with the entropy.
void logsoftmax_backward(float* dlogits, const float* logits, int V, float inv_tau,
                         const SoftmaxStats& st, int target, double d_logp, double d_entropy,
                         double scale);

// Cross-entropy on logits [N,V] with per-row weights (0 = ignore): returns sum_i w_i * CE_i and,
// if dlogits is non-null, adds w_i * (softmax - onehot) into dlogits.
double crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                     const float* weights, int N, int V);

}  // namespace moerl::model
