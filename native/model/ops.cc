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
    kernels().matmul_small(out, inp, weight, N, IC, OC);
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

void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int H, int Hkv,
                       int D) {
  const int W = (H + 2 * Hkv) * D, Q = H * D, G = H / Hkv;
  const float scale = 1.0f / std::sqrt((float)D);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      const int ko = Q + (h / G) * D, vo = Q + Hkv * D + (h / G) * D;  // this head's k and v
      for (int t = 0; t < T; t++) {
        const float* q = qkv + ((size_t)b * T + t) * W + h * D;
        float* p = probs + (((size_t)b * H + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int s = 0; s <= t; s++) {
          const float* k = qkv + ((size_t)b * T + s) * W + ko;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int d = 0; d < D; d++) dot += q[d] * k[d];
          p[s] = dot * scale;
          maxv = std::max(maxv, p[s]);
        }
        float sum = 0.0f;
        for (int s = 0; s <= t; s++) {
          p[s] = std::exp(p[s] - maxv);
          sum += p[s];
        }
        for (int s = 0; s <= t; s++) p[s] /= sum;
        for (int s = t + 1; s < T; s++) p[s] = 0.0f;
        float* o = out + ((size_t)b * T + t) * Q + h * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int s = 0; s <= t; s++) {
          const float* v = qkv + ((size_t)b * T + s) * W + vo;
          for (int d = 0; d < D; d++) o[d] += p[s] * v[d];
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                        int B, int T, int H, int Hkv, int D) {
  const int W = (H + 2 * Hkv) * D, Q = H * D, G = H / Hkv;
  const float scale = 1.0f / std::sqrt((float)D);
  std::vector<float> dp(T);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < H; h++) {
      const int ko = Q + (h / G) * D, vo = Q + Hkv * D + (h / G) * D;
      for (int t = 0; t < T; t++) {
        const float* p = probs + (((size_t)b * H + h) * T + t) * T;
        const float* dout_t = dout + ((size_t)b * T + t) * Q + h * D;
        // through o = sum_s p_s v_s
        float pdp = 0.0f;
        for (int s = 0; s <= t; s++) {
          const float* v = qkv + ((size_t)b * T + s) * W + vo;
          float* dv = dqkv + ((size_t)b * T + s) * W + vo;
          float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
          for (int d = 0; d < D; d++) {
            acc += dout_t[d] * v[d];
            dv[d] += p[s] * dout_t[d];
          }
          dp[s] = acc;
          pdp += p[s] * acc;
        }
        // through softmax, then the scaled dot product
        const float* q = qkv + ((size_t)b * T + t) * W + h * D;
        float* dq = dqkv + ((size_t)b * T + t) * W + h * D;
        for (int s = 0; s <= t; s++) {
          float dscore = p[s] * (dp[s] - pdp) * scale;
          const float* k = qkv + ((size_t)b * T + s) * W + ko;
          float* dk = dqkv + ((size_t)b * T + s) * W + ko;
          for (int d = 0; d < D; d++) {
            dq[d] += dscore * k[d];
            dk[d] += dscore * q[d];
          }
        }
      }
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
  for (int i = 0; i < n; i++) {
    float sig = 1.0f / (1.0f + std::exp(-h1[i]));
    act[i] = h1[i] * sig * h3[i];
  }
}

void swiglu_backward(float* dh1, float* dh3, const float* dact, const float* h1, const float* h3,
                     int n) {
  for (int i = 0; i < n; i++) {
    float sig = 1.0f / (1.0f + std::exp(-h1[i]));
    float silu = h1[i] * sig;
    dh3[i] += dact[i] * silu;
    dh1[i] += dact[i] * h3[i] * sig * (1.0f + h1[i] * (1.0f - sig));
  }
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
