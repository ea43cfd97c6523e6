// Layer ops: forward/backward pairs. GEMMs go through OpenBLAS; everything else is a
// plain loop kept simple enough to check against the golden reference by eye.
#include "model/ops.h"

#include <cblas.h>  // cblas_sgemm

#include <algorithm>  // std::max, std::copy_n
#include <cmath>      // std::exp, std::sqrt, std::log, std::pow, std::cos, std::sin
#include <vector>

#include "model/kernels.h"

namespace moerl::model {

// ----------------------------------------------------------------------------
// matmul

void matmul_forward(float* out, const float* inp, const float* weight, int N, int IC, int OC) {
  if (N == 0) return;
  if (N <= kSmallMatmulRows) {
    kernels().matmul_small(out, inp, weight, N, IC, OC, IC);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f,
              out, OC);
}

void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
  if (N == 0) return;
  if (dinp != nullptr)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC,
                1.0f, dinp, IC);
  if (dweight != nullptr)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f,
                dweight, IC);
}

// ----------------------------------------------------------------------------
// rmsnorm

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  for (int i = 0; i < N; i++) {
    const float* x = inp + (size_t)i * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float r = 1.0f / std::sqrt(ss / C + eps);
    rstd[i] = r;
    float* o = out + (size_t)i * C;
    for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  // y = x r w with r = (mean x^2 + eps)^-1/2;  dr/dx_c = -r^3 x_c / C.
  for (int i = 0; i < N; i++) {
    const float* x = inp + (size_t)i * C;
    const float* dy = dout + (size_t)i * C;
    float* dx = dinp + (size_t)i * C;
    float r = rstd[i];
    float dot = 0.0f;  // sum_c dy_c w_c x_c
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < C; c++) {
      dot += dy[c] * weight[c] * x[c];
      dweight[c] += dy[c] * x[c] * r;
    }
    float k = dot * r * r * r / C;
    for (int c = 0; c < C; c++) dx[c] += dy[c] * weight[c] * r - k * x[c];
  }
}

// ----------------------------------------------------------------------------
// causal grouped-query attention

// Per sequence and head, four GEMMs over the whole [T,T] square (2x the causal work, but
// OpenBLAS runs it ~10x faster than dot-product loops at T = 128) and a causal softmax between.
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int H, int Hkv,
                       int D) {
  const int W = (H + 2 * Hkv) * D, Q = H * D, G = H / Hkv;
  const float scale = 1.0f / std::sqrt((float)D);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      const float* q = qkv + (size_t)b * T * W + h * D;             // [T,D], row stride W
      const float* k = qkv + (size_t)b * T * W + Q + (h / G) * D;   // this head's k and v
      const float* v = k + Hkv * D;
      float* p = probs + ((size_t)b * H + h) * T * T;               // [T,T]
      // p = scale q k^T, then a softmax over s <= t of each row t (zero above the diagonal)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, W, k, W, 0.0f, p,
                  T);
      for (int t = 0; t < T; t++) {
        float* row = p + (size_t)t * T;
        float maxv = -INFINITY;
        for (int s = 0; s <= t; s++) maxv = std::max(maxv, row[s]);
        float sum = 0.0f;
        for (int s = 0; s <= t; s++) {
          row[s] = std::exp(row[s] - maxv);
          sum += row[s];
        }
        for (int s = 0; s <= t; s++) row[s] /= sum;
        for (int s = t + 1; s < T; s++) row[s] = 0.0f;
      }
      // out [T,D] (row stride Q) = p v
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.0f, p, T, v, W, 0.0f,
                  out + (size_t)b * T * Q + h * D, Q);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                        int B, int T, int H, int Hkv, int D) {
  const int W = (H + 2 * Hkv) * D, Q = H * D, G = H / Hkv;
  const float scale = 1.0f / std::sqrt((float)D);
  std::vector<float> ds((size_t)T * T);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      const size_t qo = (size_t)b * T * W + h * D, ko = (size_t)b * T * W + Q + (h / G) * D,
                   vo = ko + Hkv * D;
      const float* p = probs + ((size_t)b * H + h) * T * T;
      const float* dout_h = dout + (size_t)b * T * Q + h * D;  // [T,D], row stride Q
      // through out = p v: dp = dout v^T into ds, dv += p^T dout
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1.0f, dout_h, Q, qkv + vo, W,
                  0.0f, ds.data(), T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, p, T, dout_h, Q, 1.0f,
                  dqkv + vo, W);
      // through the softmax: ds = scale p (dp - sum_s p dp), zero above the diagonal
      for (int t = 0; t < T; t++) {
        const float* pr = p + (size_t)t * T;
        float* dr = ds.data() + (size_t)t * T;
        float pdp = 0.0f;
        for (int s = 0; s <= t; s++) pdp += pr[s] * dr[s];
        for (int s = 0; s <= t; s++) dr[s] = pr[s] * (dr[s] - pdp) * scale;
        for (int s = t + 1; s < T; s++) dr[s] = 0.0f;
      }
      // through p = scale q k^T: dq += ds k, dk += ds^T q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.0f, ds.data(), T,
                  qkv + ko, W, 1.0f, dqkv + qo, W);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, ds.data(), T, qkv + qo,
                  W, 1.0f, dqkv + ko, W);
    }
  }
}

// ----------------------------------------------------------------------------
// rotary position embedding, rotate-half convention

void rope_angles(float* cos_out, float* sin_out, int position, int D, float theta) {
  // As transformers computes them in fp32: inv_freq_j = 1 / theta^(2j/D), angle = pos * inv_freq_j.
  for (int j = 0; j < D / 2; j++) {
    float inv_freq = 1.0f / std::pow(theta, (float)(2 * j) / (float)D);
    float angle = (float)position * inv_freq;
    cos_out[j] = std::cos(angle);
    sin_out[j] = std::sin(angle);
  }
}

namespace {

// Rotates each pair (x_j, x_{j+D/2}) of the first `heads` heads of every row by sign * angle.
void rope_rotate(float* x, const int32_t* positions, int N, int stride, int heads, int D,
                 float theta, float sign) {
  const int half = D / 2;
  std::vector<float> c(half), s(half);
  for (int i = 0; i < N; i++) {
    rope_angles(c.data(), s.data(), positions[i], D, theta);
    for (int h = 0; h < heads; h++) {
      float* v = x + (size_t)i * stride + h * D;
      for (int j = 0; j < half; j++) {
        float a = v[j], b = v[j + half], sn = sign * s[j];
        v[j] = a * c[j] - b * sn;
        v[j + half] = b * c[j] + a * sn;
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* positions, int N, int stride, int heads, int D,
                  float theta) {
  rope_rotate(x, positions, N, stride, heads, D, theta, 1.0f);
}

void rope_backward(float* dx, const int32_t* positions, int N, int stride, int heads, int D,
                   float theta) {
  // The transpose of a rotation is the rotation by the opposite angle.
  rope_rotate(dx, positions, N, stride, heads, D, theta, -1.0f);
}

// ----------------------------------------------------------------------------
// SwiGLU

void swiglu_forward(float* act, const float* h1, const float* h3, int n) {
  kernels().swiglu_forward(act, h1, h3, n);
}

void swiglu_backward(float* dh1, float* dh3, const float* dact, const float* h1, const float* h3,
                     int n) {
  kernels().swiglu_backward(dh1, dh3, dact, h1, h3, n);
}

// ----------------------------------------------------------------------------
// embeddings

void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int N, int C) {
  for (int i = 0; i < N; i++) {
    const float* te = wte + (size_t)tokens[i] * C;
    float* o = out + (size_t)i * C;
    if (wpe == nullptr) {
      std::copy_n(te, C, o);
      continue;
    }
    const float* pe = wpe + (size_t)positions[i] * C;
    for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int N, int C, int skip_token) {
  for (int i = 0; i < N; i++) {
    float* dte = dwte + (size_t)tokens[i] * C;
    const float* d = dout + (size_t)i * C;
    if (tokens[i] != skip_token)
      for (int c = 0; c < C; c++) dte[c] += d[c];
    if (dwpe == nullptr) continue;
    float* dpe = dwpe + (size_t)positions[i] * C;
    for (int c = 0; c < C; c++) dpe[c] += d[c];
  }
}

// ----------------------------------------------------------------------------
// softmax and cross-entropy

void softmax_rows(float* x, int N, int V) {
  for (int i = 0; i < N; i++) {
    float* r = x + (size_t)i * V;
    float maxv = r[0];
    for (int v = 1; v < V; v++) maxv = std::max(maxv, r[v]);
    float sum = 0.0f;
    for (int v = 0; v < V; v++) {
      r[v] = std::exp(r[v] - maxv);
      sum += r[v];
    }
    for (int v = 0; v < V; v++) r[v] /= sum;
  }
}

SoftmaxStats softmax_stats(const float* logits, int V, float inv_tau, bool with_entropy) {
  return kernels().softmax_stats(logits, V, inv_tau, with_entropy);
}

void softmax_probs(double* p, const float* logits, int V, float inv_tau, const SoftmaxStats& st) {
  kernels().softmax_probs(p, logits, V, inv_tau, st);
}

void logsoftmax_backward(float* dlogits, const float* logits, int V, float inv_tau,
                         const SoftmaxStats& st, int target, double d_logp, double d_entropy,
                         double scale) {
  kernels().logsoftmax_backward(dlogits, logits, V, inv_tau, st, target, d_logp, d_entropy, scale);
}

double crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                     const float* weights, int N, int V) {
  double loss = 0.0;
  std::vector<float> g(dlogits != nullptr ? V : 0);
  for (int i = 0; i < N; i++) {
    if (weights[i] == 0.0f) continue;
    const float* r = logits + (size_t)i * V;
    const SoftmaxStats st = softmax_stats(r, V, 1.0f, false);
    loss -= weights[i] * st.logprob(r, targets[i], 1.0f);
    if (dlogits == nullptr) continue;
    logsoftmax_backward(g.data(), r, V, 1.0f, st, targets[i], -1.0, 0.0, weights[i]);
    float* d = dlogits + (size_t)i * V;
    for (int v = 0; v < V; v++) d[v] += g[v];
  }
  return loss;
}

}  // namespace moerl::model
