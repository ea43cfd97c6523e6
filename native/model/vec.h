// Fixed-width vectors in GCC's vector extensions for the kernels (kernels.h), at the variant's
// own register width: floats as fn (16, 8 or 4 lanes: one zmm, ymm or xmm) and doubles as dn
// (8, 4 or 2). A wider GCC vector than the target's registers is split into pieces that GCC
// moves through the stack, and its compares and selects run lane by lane (an AVX2 CPU ran the
// decode step 5x slower so); so a kernel whose sums have a fixed lane count (16 floats, 8
// doubles) holds each sum as several native vectors, "parts", lane j in part j / lanes.
// Every operation is the same IEEE arithmetic in each lane at any width, and the sums fold in one
// fixed tree (hsum), so the bits do not depend on the variant; -ffp-contract=off
// (model/CMakeLists.txt) keeps a*b+c two roundings where FMA exists too. Plain auto-vectorised
// loops could not promise this: GCC leaves a loop scalar for one select it cannot if-convert,
// and `omp simd` reductions sum in an order that follows the vector width.
#pragma once

#include <cmath>    // std::fma, the baseline's fused multiply-add
#include <cstdint>  // int32_t, int64_t lanes
#include <cstring>  // std::memcpy for loads, stores and bit casts
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>  // _mm512_fmadd_ps, _mm256_fmadd_ps
#endif

namespace moerl::model::vec {
// Internal linkage: each variant's translation unit keeps its own copies (with one shared
// inline definition the linker could hand the baseline code an AVX-512 copy).
namespace {

typedef float f16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
typedef float f8 __attribute__((vector_size(32)));

// ---- floats at the variant's own register width: 16, 8 or 4 (one zmm, ymm or xmm)

#if defined(__AVX512F__)
typedef f16 fn;
#elif defined(__AVX2__)
typedef f8 fn;
#else
typedef float fn __attribute__((vector_size(16)));
#endif
typedef decltype(fn{} < fn{}) in;  // its int32 lanes
constexpr int kNativeLanes = sizeof(fn) / sizeof(float);
inline fn splatn(float x) { return fn{} + x; }
inline fn loadn(const float* p) {
  fn v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// The first n < kNativeLanes values of p, the other lanes `fill`.
inline fn loadn_tail(const float* p, int n, float fill) {
  fn v = splatn(fill);
  for (int j = 0; j < n; j++) v[j] = p[j];
  return v;
}
inline void storen(float* p, fn v) { std::memcpy(p, &v, sizeof v); }
inline void storen_tail(float* p, fn v, int n) {
  for (int j = 0; j < n; j++) p[j] = v[j];
}
// Lane-wise max; a NaN in x never replaces m.
inline fn maxn(fn m, fn x) { return x > m ? x : m; }
// Max of the lanes (exact: the order does not matter; NaN lanes are never taken).
inline float hmax(fn v) {
  float m = v[0];
  for (int j = 1; j < kNativeLanes; j++) m = v[j] > m ? v[j] : m;
  return m;
}
// Calls f(c, n) for consecutive blocks of kNativeLanes from 0 to `count` (the tail's n fewer).
template <typename F>
inline void for_native_blocks(int count, F&& f) {
  const int full = count / kNativeLanes * kNativeLanes;
  for (int c = 0; c < full; c += kNativeLanes) f(c, kNativeLanes);
  if (full < count) f(full, count - full);
}
// a * b + c with one rounding per lane (IEEE fusedMultiplyAdd, the same bits at any width): one
// instruction where the variant has FMA (AVX-512; AVX2 is built with -mfma), std::fma per lane
// on the baseline (exact, slow: a CPU without AVX2 only).
inline fn fman(fn a, fn b, fn c) {
#if defined(__AVX512F__)
  return (fn)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (fn)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  for (int j = 0; j < kNativeLanes; j++) c[j] = std::fma(a[j], b[j], c[j]);
  return c;
#endif
}
constexpr int kParts = 16 / kNativeLanes;  // native vectors per 16 lanes
// The 16-lane vector whose lanes are parts[0]'s, then parts[1]'s, ...
inline f16 join16(const fn (&parts)[kParts]) {
  f16 v;
  std::memcpy(&v, parts, sizeof v);
  return v;
}
// The sum of all lanes of parts[0], parts[1], ... joined in order, as one fixed tree: lane j +
// lane j + w for w = half the lanes, then half that, ..., 1. In registers: the levels w >= one
// vector's lanes add whole parts, the others add a shuffled copy of one vector.
template <typename V, int P>
inline auto hsum(const V (&parts)[P]) {
  typedef decltype(parts[0] < parts[0]) Lanes;  // integer lanes as wide as V's
  constexpr int L = sizeof(V) / sizeof(parts[0][0]);
  V t[P];
  for (int p = 0; p < P; p++) t[p] = parts[p];
  for (int w = P / 2; w > 0; w /= 2)
    for (int j = 0; j < w; j++) t[j] += t[j + w];
  V v = t[0];
  for (int w = L / 2; w > 0; w /= 2) {
    Lanes lane;
    for (int j = 0; j < L; j++) lane[j] = (j + w) % L;
    v += __builtin_shuffle(v, lane);
  }
  return v[0];
}

// Lane k of the result = hsum(v[k]) for 16 vectors, bit for bit: the same tree (lane j + lane
// j+w for w = 8, 4, 2, 1), run on all 16 at once by transposing pairs of vectors between
// levels (15 vector adds and 30 two-source shuffles instead of 16 horizontal sums).
inline f16 hsum16x16(const f16 v[16]) {
  // level w = 8: c[k] lanes 0-7 sum v[2k], lanes 8-15 v[2k+1]
  const i16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const i16 lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const i16 lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const i16 lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  f16 c[8], d[4], e[2];
  for (int k = 0; k < 8; k++)
    c[k] = __builtin_shuffle(v[2 * k], v[2 * k + 1], lo8) +
           __builtin_shuffle(v[2 * k], v[2 * k + 1], lo8 + 8);
  // w = 4: d[k] holds 4 vectors' partial sums, 4 lanes each; w = 2: e[k] 8 vectors, 2 lanes
  for (int k = 0; k < 4; k++)
    d[k] = __builtin_shuffle(c[2 * k], c[2 * k + 1], lo4) +
           __builtin_shuffle(c[2 * k], c[2 * k + 1], lo4 + 4);
  for (int k = 0; k < 2; k++)
    e[k] = __builtin_shuffle(d[2 * k], d[2 * k + 1], lo2) +
           __builtin_shuffle(d[2 * k], d[2 * k + 1], lo2 + 2);
  return __builtin_shuffle(e[0], e[1], lo1) + __builtin_shuffle(e[0], e[1], lo1 + 1);
}

// exp(x) for x <= 0 in fp32 within 2 ulp (Cephes' expf: x = n ln2 + r, a polynomial in r, 2^n
// from the exponent bits); 0 below -87.3 (where exp would turn subnormal) and for -inf.
inline fn exp_nonpositive(fn x) {
  const float lo = -87.3f;
  const fn xc = x < lo ? splatn(lo) : x;
  const fn n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to integer
  const fn r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;            // ln2 in two parts
  fn p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  in bits = (__builtin_convertvector(n, in) + 127) << 23;
  bits &= (x >= lo) | (x != x);  // 0 below lo; a NaN keeps its (NaN) polynomial
  fn scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
// sigmoid(x) = 1 / (1 + exp(-x)), from exp(-|x|) so that exp never overflows.
inline fn sigmoid(fn x) {
  const fn e = exp_nonpositive(x < 0.0f ? x : -x);
  return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// ---- doubles at the variant's own register width: 8, 4 or 2 (one zmm, ymm or xmm)
//
// The softmax over a vocabulary row sums in fp64, 8 accumulator lanes (lane j sums the values
// v = j mod 8 in order), held as kDoubleParts native vectors: value v in part (v / kDoubleLanes)
// mod kDoubleParts, lane v mod kDoubleLanes. The same bits at every width, in registers.
#if defined(__AVX512F__)
typedef double dn __attribute__((vector_size(64)));
#elif defined(__AVX2__)
typedef double dn __attribute__((vector_size(32)));
#else
typedef double dn __attribute__((vector_size(16)));
#endif
constexpr int kDoubleLanes = sizeof(dn) / sizeof(double);
constexpr int kDoubleParts = 8 / kDoubleLanes;
typedef float fdn __attribute__((vector_size(kDoubleLanes * sizeof(float))));  // dn's floats
typedef int64_t ldn __attribute__((vector_size(sizeof(dn))));                  // its masks

inline dn splatd(double x) { return dn{} + x; }
// kDoubleLanes floats widened to fp64 (exact); the tail form reads n < kDoubleLanes and fills
// the other lanes.
inline dn loadd(const float* p) {
  fdn v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, dn);
}
inline dn loadd_tail(const float* p, int n, double fill) {
  dn v = splatd(fill);
  for (int j = 0; j < n; j++) v[j] = p[j];
  return v;
}
// Rounded to fp32 and stored; the tail form writes the first n.
inline void stored(float* p, dn v) {
  const fdn f = __builtin_convertvector(v, fdn);
  std::memcpy(p, &f, sizeof f);
}
inline void stored(double* p, dn v) { std::memcpy(p, &v, sizeof v); }
template <typename T>
inline void stored_tail(T* p, dn v, int n) {
  for (int j = 0; j < n; j++) p[j] = (T)v[j];
}

// exp(x) for x <= 0 in fp64, within 5 ulp (measured 4.2): x = n ln2 + r with |r| <= ln2/2 and
// ln2 in two parts (fdlibm's), exp(r) by its Taylor polynomial to r^12 (error 2e-16), 2^n from
// the exponent bits; 0 below -708 (where exp would turn subnormal) and for -inf; NaN stays NaN.
inline dn exp_nonpositive(dn x) {
  const double lo = -708.0, shift = 6755399441055744.0;  // 1.5 * 2^52: n lands in t's low bits
  const dn xc = x < lo ? splatd(lo) : x;
  const dn t = xc * 1.4426950408889634 + shift;
  const dn n = t - shift;
  const dn r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  constexpr double c[] = {1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040,
                          1.0 / 720,      1.0 / 120,     1.0 / 24,     1.0 / 6,     1.0 / 2,
                          1.0,            1.0};  // 1/11! .. 1/0!
  dn p = splatd(1.0 / 479001600);                  // 1/12!
  for (double ck : c) p = p * r + ck;
  ldn bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits + 1023) << 52;    // t's low 12 bits are n + 1023 mod 2^12, n in [-1022, 0]
  bits &= (x >= lo) | (x != x);  // 0 below lo; a NaN keeps its (NaN) polynomial
  dn scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace
}  // namespace moerl::model::vec
