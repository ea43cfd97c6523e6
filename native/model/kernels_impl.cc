// The kernels of kernels.h, compiled once per variant: CMake builds this file with
// MOERL_KERNELS_NAME = baseline (no flags), avx2 (-mavx2 -mfma) and avx512 (-mavx512f), each with
// -ffp-contract=off, into namespace kernels_<name>. Only the vector width and the register
// blocking differ between them, never the order of a sum (vec.h).
#include <algorithm>  // std::min, std::copy_n, std::fill
#include <cmath>      // std::exp, std::log, INFINITY

#include "model/kernels.h"
#include "model/vec.h"

#ifndef MOERL_KERNELS_NAME
#error "kernels_impl.cc is compiled through CMake, which names the variant (MOERL_KERNELS_NAME)"
#endif
#define MOERL_CAT2(a, b) a##b
#define MOERL_CAT(a, b) MOERL_CAT2(a, b)
#define MOERL_KERNELS_NS MOERL_CAT(kernels_, MOERL_KERNELS_NAME)
#define MOERL_STR2(x) #x
#define MOERL_STR(x) MOERL_STR2(x)

namespace moerl::model::MOERL_KERNELS_NS {
namespace {

// ----------------------------------------------------------------------------
// softmax over a vocabulary row, in fp64 from fp32 logits

// Calls f(x, v, n, part) for consecutive blocks of kDoubleLanes logits from v widened to fp64
// (x), with the block's valid count n (kDoubleLanes, or the tail's fewer; the tail's other lanes
// are -inf, whose exp is 0) and the accumulator part its values belong to (vec.h).
template <typename F>
void for_blocks(const float* logits, int V, F&& f) {
  using namespace vec;
  constexpr int L = kDoubleLanes;
  const int full = V / L * L;
  for (int v = 0; v < full; v += L) f(loadd(logits + v), v, L, v / L % kDoubleParts);
  if (full < V)
    f(loadd_tail(logits + full, V - full, -INFINITY), full, V - full, full / L % kDoubleParts);
}

SoftmaxStats softmax_stats(const float* logits, int V, float inv_tau, bool with_entropy) {
  using namespace vec;
  // the max in fp32 (exact)
  fn m = splatn(-INFINITY);
  for_native_blocks(V, [&](int v, int n) {
    m = maxn(m, n == kNativeLanes ? loadn(logits + v) : loadn_tail(logits + v, n, -INFINITY));
  });
  SoftmaxStats st;
  st.max_logit = hmax(m);
  // d_v = (logits_v - max) * inv_tau, e_v = exp(d_v); S = sum e_v, D = sum e_v d_v (lane j of
  // each accumulator sums v = j mod 8 in order): log p_v = d_v - log S, H = log S - D / S.
  const dn top = splatd(st.max_logit), tau = splatd(inv_tau);
  dn S[kDoubleParts] = {}, D[kDoubleParts] = {};
  ldn nan{};
  for_blocks(logits, V, [&](dn x, int, int, int part) {
    const dn d = (x - top) * tau;
    const dn e = exp_nonpositive(d);
    nan |= d != d;
    S[part] += e;
    if (with_entropy) D[part] += e > 0.0 ? e * d : 0.0;  // 0, not NaN, for d = -inf
  });
  bool any_nan = false;
  for (int j = 0; j < kDoubleLanes; j++) any_nan |= nan[j] != 0;
  const double sum = hsum(S);
  st.log_sum = any_nan ? NAN : std::log(sum);
  if (with_entropy) st.entropy = st.log_sum - hsum(D) / sum;
  return st;
}

void softmax_probs(double* p, const float* logits, int V, float inv_tau, const SoftmaxStats& st) {
  using namespace vec;
  const dn top = splatd(st.max_logit), tau = splatd(inv_tau),
           inv_sum = splatd(std::exp(-st.log_sum));
  for_blocks(logits, V, [&](dn x, int v, int n, int) {
    const dn pv = exp_nonpositive((x - top) * tau) * inv_sum;
    if (n == kDoubleLanes)
      stored(p + v, pv);
    else
      stored_tail(p + v, pv, n);
  });
}

void logsoftmax_backward(float* dlogits, const float* logits, int V, float inv_tau,
                         const SoftmaxStats& st, int target, double d_logp, double d_entropy,
                         double scale) {
  using namespace vec;
  // d log p_t / dz_v = [v = t] - p_v,  dH / dz_v = -p_v (log p_v + H),  dz_v / dlogit_v = inv_tau:
  // g_v = k (d_logp [v = t] - p_v (d_logp + d_entropy (d_v - log S + H))), k = scale * inv_tau,
  // in fp64 and rounded once.
  const double k = scale * inv_tau;
  const double lp_t = st.logprob(logits, target, inv_tau);  // read before an in-place write
  const double p_t = std::exp(lp_t);
  const double g_t = k * (d_logp * (1.0 - p_t) - d_entropy * p_t * (lp_t + st.entropy));
  const dn top = splatd(st.max_logit), tau = splatd(inv_tau), a = splatd(k * d_logp),
           b = splatd(k * d_entropy), c = splatd(st.entropy - st.log_sum),
           inv_sum = splatd(std::exp(-st.log_sum));
  for_blocks(logits, V, [&](dn x, int v, int n, int) {
    const dn d = (x - top) * tau;
    const dn p = exp_nonpositive(d) * inv_sum;
    const dn g = d_entropy == 0.0 ? -p * a : p > 0.0 ? -p * (a + b * (d + c)) : 0.0;
    if (n == kDoubleLanes)
      stored(dlogits + v, g);
    else
      stored_tail(dlogits + v, g, n);
  });
  dlogits[target] = (float)g_t;
}

// ----------------------------------------------------------------------------
// SwiGLU gate

void swiglu_forward(float* act, const float* h1, const float* h3, int n) {
  using namespace vec;
  for_native_blocks(n, [&](int v, int k) {
    auto in = [&](const float* p) {
      return k == kNativeLanes ? loadn(p + v) : loadn_tail(p + v, k, 0.0f);
    };
    const fn a = in(h1), b = in(h3);
    const fn y = a * sigmoid(a) * b;
    if (k == kNativeLanes)
      storen(act + v, y);
    else
      storen_tail(act + v, y, k);
  });
}

void swiglu_backward(float* dh1, float* dh3, const float* dact, const float* h1, const float* h3,
                     int n) {
  using namespace vec;
  for_native_blocks(n, [&](int v, int k) {
    auto in = [&](const float* p) {
      return k == kNativeLanes ? loadn(p + v) : loadn_tail(p + v, k, 0.0f);
    };
    const fn a = in(h1), b = in(h3), g = in(dact), d1 = in(dh1), d3 = in(dh3);
    const fn sig = sigmoid(a);
    const fn y3 = d3 + g * (a * sig);
    const fn y1 = d1 + g * b * sig * (1.0f + a * (1.0f - sig));
    if (k == kNativeLanes) {
      storen(dh1 + v, y1);
      storen(dh3 + v, y3);
    } else {
      storen_tail(dh1 + v, y1, k);
      storen_tail(dh3 + v, y3, k);
    }
  });
}

// ----------------------------------------------------------------------------
// attention of one decode row over its KV cache

void attend_cached(float* out, int ldo, float* scores, const float* v, int ldv, int G, int len,
                   int D, float scale) {
  using namespace vec;
  for (int g = 0; g < G; g++) {
    float* sc = scores + (size_t)g * len;
    auto in = [&](int s, int n) {
      return n == kNativeLanes ? loadn(sc + s) : loadn_tail(sc + s, n, -INFINITY);
    };
    fn m = splatn(-INFINITY);
    for_native_blocks(len, [&](int s, int n) { m = maxn(m, in(s, n) * scale); });
    const fn top = splatn(hmax(m));
    // lane j of the sum adds the positions s = j mod 16 in order (vec.h: parts of 16 lanes)
    fn acc[kParts] = {};
    for_native_blocks(len, [&](int s, int n) {
      const fn e = exp_nonpositive(in(s, n) * scale - top);
      acc[s / kNativeLanes % kParts] += e;
      if (n == kNativeLanes)
        storen(sc + s, e);
      else
        storen_tail(sc + s, e, n);
    });
    const float sum = hsum(acc);
    // out = sum_s (e_s / sum) v_s, kNativeLanes channels at a time, positions in order
    float* o = out + (size_t)g * ldo;
    for_native_blocks(D, [&](int d, int k) {
      fn od{};
      for (int s = 0; s < len; s++) {
        const float* vs = v + (size_t)s * ldv + d;
        od += (sc[s] / sum) * (k == kNativeLanes ? loadn(vs) : loadn_tail(vs, k, 0.0f));
      }
      if (k == kNativeLanes)
        storen(o + d, od);
      else
        storen_tail(o + d, od, k);
    });
  }
}

// ----------------------------------------------------------------------------
// few-row matmul

// Register blocking, kRows rows of inp by kOuts rows of weight: as many accumulators as the
// variant's registers hold (32 zmm, 16 ymm, 16 xmm; a 16-lane sum is 1, 2 or 4 of them).
#if defined(__AVX512F__)
constexpr int kRows = 4, kOuts = 4;
#elif defined(__AVX2__)
constexpr int kRows = 3, kOuts = 2;
#else
constexpr int kRows = 2, kOuts = 1;
#endif

// 16 channels of O weight rows and R input rows into the sums acc[a][r] (dot_block).
template <int R, int O, bool Fma>
inline void accumulate16(vec::fn (&acc)[O][R][vec::kParts], const float* const (&wrow)[O],
                         const float* const (&xrow)[R]) {
  using namespace vec;
  for (int p = 0; p < kParts; p++) {
    fn wv[O];
    for (int a = 0; a < O; a++) wv[a] = loadn(wrow[a] + p * kNativeLanes);
    for (int r = 0; r < R; r++) {
      fn x = loadn(xrow[r] + p * kNativeLanes);
#if defined(__x86_64__)
      // one load of x for its O products: GCC would fold it into each FMA as a memory operand,
      // O loads where the load ports, not the FMA units, bound the loop
      asm("" : "+v"(x));
#endif
      for (int a = 0; a < O; a++)
        acc[a][r][p] = Fma ? fman(wv[a], x, acc[a][r][p]) : acc[a][r][p] + wv[a] * x;
    }
  }
}

// out[i0+r, o0+a] for r < R, a < O: lane j of each 16-lane sum adds inp[.,c] * weight[.,c] over
// c = j mod 16 in channel order (the tail zero-padded), then vec::hsum folds the lanes. Each sum
// is kParts native vectors (vec.h), so the accumulators stay in registers at any width.
template <int R, int O, bool Fma>
void dot_block(float* out, const float* inp, const float* weight, int IC, int OC, int ldw, int i0,
               int o0, bool prefetch_next) {
  using namespace vec;
  fn acc[O][R][kParts];
  for (auto& sums : acc)  // by element: `= {}` compiled to a slow `rep stos` here
    for (auto& parts : sums)
      for (fn& part : parts) part = fn{};
  const float* w = weight + (size_t)o0 * ldw;
  const int full = IC / 16 * 16, rest = IC - full;
  for (int c = 0; c < full; c += 16) {
    const float* wrow[O];
    const float* xrow[R];
    for (int a = 0; a < O; a++) {
      wrow[a] = w + (size_t)a * ldw + c;
      // the rows two blocks ahead into L2 while this block computes, so the weight streams from
      // memory once and overlaps the arithmetic (into L1 or one block ahead measured 1.5x
      // slower: 192 MiB of expert weights at 8 rows in 30 ms instead of 20, sgemm 37)
      if (prefetch_next) __builtin_prefetch(w + (size_t)(a + 2 * O) * ldw + c, 0, 2);
    }
    for (int r = 0; r < R; r++) xrow[r] = inp + (size_t)(i0 + r) * IC + c;
    accumulate16<R, O, Fma>(acc, wrow, xrow);
  }
  if (rest > 0) {
    // the last IC mod 16 channels, zero-padded to 16
    float wpad[O][16], xpad[R][16];
    const float* wrow[O];
    const float* xrow[R];
    for (int a = 0; a < O; a++) {
      std::fill(std::copy_n(w + (size_t)a * ldw + full, rest, wpad[a]), wpad[a] + 16, 0.0f);
      wrow[a] = wpad[a];
    }
    for (int r = 0; r < R; r++) {
      std::fill(std::copy_n(inp + (size_t)(i0 + r) * IC + full, rest, xpad[r]), xpad[r] + 16, 0.0f);
      xrow[r] = xpad[r];
    }
    accumulate16<R, O, Fma>(acc, wrow, xrow);
  }
  if constexpr (R * O == 16) {
    // all 16 sums in one transposed tree (the same bits as hsum each): lane a*R + r
    f16 sums16[16];
    for (int a = 0; a < O; a++)
      for (int r = 0; r < R; r++) sums16[a * R + r] = join16(acc[a][r]);
    const f16 sums = hsum16x16(sums16);
    for (int r = 0; r < R; r++)
      for (int a = 0; a < O; a++) out[(size_t)(i0 + r) * OC + o0 + a] = sums[a * R + r];
  } else {
    for (int r = 0; r < R; r++)
      for (int a = 0; a < O; a++) out[(size_t)(i0 + r) * OC + o0 + a] = hsum(acc[a][r]);
  }
}

// Every row of inp against weight rows [o0, o0 + O).
template <int O, bool Fma>
void all_rows(float* out, const float* inp, const float* weight, int N, int IC, int OC, int ldw,
              int o0, bool prefetch_next) {
  int i = 0;
  for (; i + kRows <= N; i += kRows)
    dot_block<kRows, O, Fma>(out, inp, weight, IC, OC, ldw, i, o0, prefetch_next && i == 0);
  // the last N mod kRows rows in one block (an expert's ~8 decode rows often leave 1 to 3):
  // each output's sum is the same at any R, so only the speed changes
  const bool pf = prefetch_next && i == 0;
  if (N - i == 3)
    dot_block<3, O, Fma>(out, inp, weight, IC, OC, ldw, i, o0, pf);
  else if (N - i == 2)
    dot_block<2, O, Fma>(out, inp, weight, IC, OC, ldw, i, o0, pf);
  else if (N - i == 1)
    dot_block<1, O, Fma>(out, inp, weight, IC, OC, ldw, i, o0, pf);
}

// Tiles of the few-row matmul, in bytes of rows: the input rows of a tile stay in L1 while the
// weight rows of a tile pass by from L2; the weight comes from memory once per call. Without them
// a decode step's 64 input rows streamed from L2 for every kOuts weight rows (measured on an AVX2
// core, 64 x 512 x 16384: 18 GMAC/s untiled, 25 tiled; 8 KiB to 24 KiB and 32 KiB to 128 KiB
// tiles within noise of these).
constexpr int kInputTileBytes = 16 << 10, kWeightTileBytes = 64 << 10;

template <bool Fma>
void matmul_rows(float* out, const float* inp, const float* weight, int N, int IC, int OC,
                 int ldw) {
  const int row_bytes = IC * (int)sizeof(float);
  const int rows_tile = std::max(kRows, kInputTileBytes / row_bytes / kRows * kRows);
  const int outs_tile = std::max(kOuts, kWeightTileBytes / row_bytes / kOuts * kOuts);
  for (int o0 = 0; o0 < OC; o0 += outs_tile) {
    const int o1 = std::min(OC, o0 + outs_tile);
    for (int i0 = 0; i0 < N; i0 += rows_tile) {
      const int n = std::min(rows_tile, N - i0);
      float* out_rows = out + (size_t)i0 * OC;
      const float* inp_rows = inp + (size_t)i0 * IC;
      // the first input tile brings the weight tile from memory into L2 (prefetched ahead)
      const bool first = i0 == 0;
      int o = o0;
      for (; o + kOuts <= o1; o += kOuts)
        all_rows<kOuts, Fma>(out_rows, inp_rows, weight, n, IC, OC, ldw, o,
                             first && o + 3 * kOuts <= OC);
      for (; o < o1; o++) all_rows<1, Fma>(out_rows, inp_rows, weight, n, IC, OC, ldw, o, false);
    }
  }
}

void matmul_small(float* out, const float* inp, const float* weight, int N, int IC, int OC,
                  int ldw) {
  matmul_rows<false>(out, inp, weight, N, IC, OC, ldw);
}

void matmul_small_fma(float* out, const float* inp, const float* weight, int N, int IC, int OC,
                      int ldw) {
  matmul_rows<true>(out, inp, weight, N, IC, OC, ldw);
}

}  // namespace

extern const Kernels kTable = {MOERL_STR(MOERL_KERNELS_NAME), softmax_stats, softmax_probs,
                               logsoftmax_backward, swiglu_forward, swiglu_backward,
                               attend_cached, matmul_small, matmul_small_fma};

}  // namespace moerl::model::MOERL_KERNELS_NS
