// The hot loops outside OpenBLAS, compiled three times: for any x86-64 (SSE2), for AVX2 and for
// AVX-512 (kernels_impl.cc; other architectures get the first only). kernels() picks the widest
// the CPU runs, once; MOERL_KERNELS=baseline|avx2|avx512 forces one (a CPU without it is an
// error). Every variant gives the same bits: the loops work on fixed-width vectors (vec.h)
// whose lanes do the same IEEE operations at any width, with no FMA contraction, and sum in one
// fixed order; the test Kernels.VariantsGiveTheSameBits holds them to it. So a chunk sampled on an
// AVX2 node and on an AVX-512 node agrees bit for bit wherever OpenBLAS's kernels do
// (OPENBLAS_CORETYPE, docs/native-model.md).
#pragma once

#include <vector>

#include "model/ops.h"

namespace moerl::model {

struct Kernels {
  const char* name;  // "baseline", "avx2", "avx512"
  // ops.h's softmax_stats, softmax_probs, logsoftmax_backward
  SoftmaxStats (*softmax_stats)(const float* logits, int V, float inv_tau, bool with_entropy);
  void (*softmax_probs)(double* p, const float* logits, int V, float inv_tau,
                        const SoftmaxStats& st);
  void (*logsoftmax_backward)(float* dlogits, const float* logits, int V, float inv_tau,
                              const SoftmaxStats& st, int target, double d_logp, double d_entropy,
                              double scale);
  // ops.h's swiglu_forward, swiglu_backward (sigmoid from a 2-ulp fp32 exp)
  void (*swiglu_forward)(float* act, const float* h1, const float* h3, int n);
  void (*swiglu_backward)(float* dh1, float* dh3, const float* dact, const float* h1,
                          const float* h3, int n);
  // The sampler's attention of one row over its KV cache, for the G query heads of one kv
  // head: scores [G,len] holds q.k on entry (and exp of the scaled scores on return); out
  // [G,D] (row stride ldo) = softmax(scale * scores) v, v [len,D] at row stride ldv; the exp in
  // fp32 within 2 ulp, each output channel summed in position order.
  void (*attend_cached)(float* out, int ldo, float* scores, const float* v, int ldv, int G,
                        int len, int D, float scale);
  // out [N,OC] = inp [N,IC] @ weight [OC,IC]^T for a few rows (matmul_forward's small-N path;
  // the sampler's attention scores, with ldw the weight's row stride >= IC): each output is
  // one 16-lane dot product folded in a fixed order, so a row's result does not depend on N or
  // on the other rows; the weight streams through once per 4 rows (prefetched), which beats
  // OpenBLAS's pack-then-multiply when few rows read a weight from memory.
  void (*matmul_small)(float* out, const float* inp, const float* weight, int N, int IC, int OC,
                       int ldw);
  // matmul_small with each lane's products accumulated by fused multiply-adds (one rounding
  // each, vec::fman) in the same order: twice the arithmetic per cycle where the CPU has FMA,
  // the same bits on every variant (the baseline's std::fma is exact but slow). The decode
  // step's projections (sampler.cc); training keeps matmul_small.
  void (*matmul_small_fma)(float* out, const float* inp, const float* weight, int N, int IC,
                           int OC, int ldw);
};

// The variant this process uses.
const Kernels& kernels();
// Every variant this CPU can run, baseline first (tests compare them).
std::vector<const Kernels*> runnable_kernels();

// The kernels OpenBLAS runs (openblas_get_corename: "Haswell", "SkylakeX", ...).
const char* blas_core();
// Whether OpenBLAS's kernels of that name use AVX2 (its x86-64 cores, 0.3.21 to 0.3.30).
bool blas_core_uses_avx2(const char* core);
// The OPENBLAS_CORETYPE a process should set, or nullptr: OpenBLAS picks its kernels by the CPU
// model, and on a model its release does not know it falls back to pre-AVX2 kernels (0.3.21 on
// an Emerald Rapids host: "Prescott", sgemm at a fifth of the speed). Where the CPU runs AVX2
// and FMA but OpenBLAS chose kernels without them, this names the family the CPU does run:
// "SkylakeX" with AVX-512 (F, BW, DQ, VL), "Haswell" otherwise. nullptr when
// OPENBLAS_CORETYPE is set (the user's choice stands) or OpenBLAS's own choice uses AVX2.
const char* blas_core_to_set();

}  // namespace moerl::model
