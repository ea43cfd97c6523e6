// Layer ops of the MoE policy, forward and backward side by side (after llm.c).
// Every backward *adds* into its gradient outputs, so a tensor used twice simply
// receives both contributions. Dimension letters: N rows (tokens), C model width,
// OC/IC output/input channels, B sequences, T positions, H heads, F expert width.
#pragma once

#include <cstdint>  // int32_t token ids

namespace moerl::model {

// out [N,OC] = inp [N,IC] @ weight[OC,IC]^T  (OpenBLAS sgemm)
void matmul_forward(float* out, const float* inp, const float* weight, int N, int IC, int OC);
// dinp [N,IC] += dout @ weight;  dweight [OC,IC] += dout^T @ inp. Either output may be null.
void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

// out [N,C] = inp / sqrt(mean(inp^2) + eps) * weight [C];  rstd [N] saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

// out [B*T,C] = causal softmax(q k^T / sqrt(D)) v per sequence and head, D = C/H.
// qkv [B*T,3C] holds q | k | v; probs [B,H,T,T] saved for backward (upper triangle zero).
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C, int H);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                        int B, int T, int C, int H);

// act [n,F] = silu(h1) * h3  (SwiGLU gate)
void swiglu_forward(float* act, const float* h1, const float* h3, int n);
void swiglu_backward(float* dh1, float* dh3, const float* dact, const float* h1, const float* h3,
                     int n);

// out [N,C] = wte[tokens] + wpe[positions]
void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int N, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int N, int C);

// Row-wise softmax in place over [N,V]; returns nothing, rows are independent.
void softmax_rows(float* x, int N, int V);

// Cross-entropy on logits [N,V] with per-row weights (0 = ignore): returns sum_i w_i * CE_i and,
// if dlogits is non-null, adds w_i * (softmax - onehot) into dlogits.
double crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets,
                                     const float* weights, int N, int V);

}  // namespace moerl::model
