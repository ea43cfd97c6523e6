// combine: return expert outputs to the tokens' source ranks and sum them there.
//
// Rows a destination rank holds for source s are one contiguous block of y (dispatch
// delivered them so), so they are sent straight from y without packing. The source
// receives one block per destination into staging and then, token by token, adds the
// contributions in destination-rank order 0..R-1 into an fp32 accumulator and rounds once.
// That fixed order makes the result bitwise reproducible, whatever order messages arrive.
#include <cstring>  // std::memcpy, std::memset

#include "common/check.h"
#include "ep/dtype.h"
#include "ep/ep.h"

namespace moerl::ep {
namespace {

// Row kernels, compiled for AVX-512, AVX2 and baseline x86-64; the loader picks the best the
// CPU has (GCC function multiversioning), so one binary runs everywhere at full width.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOERL_ROW_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MOERL_ROW_KERNEL
#endif

MOERL_ROW_KERNEL void add_f32_row(float* dst, const float* src, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
}

MOERL_ROW_KERNEL void sum2_f32_rows(float* dst, const float* a, const float* b, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dst[c] = a[c] + b[c];
}

// acc = a + b in fp32 (a: the first contribution, b: the second).
MOERL_ROW_KERNEL void sum_bf16_rows(float* acc, const uint16_t* a, const uint16_t* b, int64_t C) {
  for (int64_t c = 0; c < C; ++c) acc[c] = bf16_to_f32(a[c]) + bf16_to_f32(b[c]);
}

// dst = bf16(a + b): the common two-contribution token in one pass, no accumulator trip.
MOERL_ROW_KERNEL void sum2_bf16_rows(uint16_t* dst, const uint16_t* a, const uint16_t* b,
                                     int64_t C) {
  for (int64_t c = 0; c < C; ++c) dst[c] = f32_to_bf16(bf16_to_f32(a[c]) + bf16_to_f32(b[c]));
}

MOERL_ROW_KERNEL void add_bf16_row(float* acc, const uint16_t* src, int64_t C) {
  for (int64_t c = 0; c < C; ++c) acc[c] += bf16_to_f32(src[c]);
}

MOERL_ROW_KERNEL void store_bf16_row(uint16_t* dst, const float* acc, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dst[c] = f32_to_bf16(acc[c]);
}

}  // namespace

void Buffer::combine(TensorView y, const Handle& h, Tensor& out) {
  const int R = num_ranks(), self = comm_.rank();
  MOERL_CHECK_INPUT(h.num_ranks == R && h.num_experts == num_experts_,
                    "combine: handle belongs to another communicator or expert count");
  MOERL_CHECK_INPUT(y.rows == h.num_recv_tokens, "combine: y has ", y.rows, " rows but the "
                    "handle received ", h.num_recv_tokens, " tokens");
  MOERL_CHECK_INPUT(y.dtype == DType::F32 || y.dtype == DType::BF16,
                    "combine: payload must be fp32 or bf16, got ", dtype_name(y.dtype));
  const int64_t C = y.cols, T = h.num_tokens;
  const size_t row_bytes = size_t(C) * dtype_bytes(y.dtype);
  const auto* y_bytes = static_cast<const uint8_t*>(y.data);

  // Exchange: block from each destination d lands at recv_staging_ + offset[d].
  std::vector<size_t> offset(static_cast<size_t>(R), 0);
  size_t staging_bytes = 0;
  for (int d = 0; d < R; ++d) {
    if (d == self) continue;
    offset[size_t(d)] = staging_bytes;
    staging_bytes += size_t(h.send_rank_prefix[d + 1] - h.send_rank_prefix[d]) * row_bytes;
  }
  if (recv_staging_.size() < staging_bytes) recv_staging_.resize(staging_bytes);
  const uint32_t op = comm_.begin_op();
  for (int r = 0; r < R; ++r) {
    if (r == self) continue;
    const int64_t num_back = h.send_rank_prefix[r + 1] - h.send_rank_prefix[r];
    if (num_back > 0)
      comm_.post_recv(r, recv_staging_.data() + offset[size_t(r)], size_t(num_back) * row_bytes,
                      op, 0);
    const int64_t num_return = h.recv_rank_prefix[r + 1] - h.recv_rank_prefix[r];
    if (num_return > 0)
      comm_.post_send(r, y_bytes + size_t(h.recv_rank_prefix[r]) * row_bytes,
                      size_t(num_return) * row_bytes, op, 0);
  }
  comm_.wait_all("combine");

  // Reduce in destination-rank order.
  std::vector<const uint8_t*> block(static_cast<size_t>(R));
  for (int d = 0; d < R; ++d)
    block[size_t(d)] = d == self ? y_bytes + size_t(h.recv_rank_prefix[self]) * row_bytes
                                 : recv_staging_.data() + offset[size_t(d)];
  out.resize(y.dtype, T, C);
  if (y.dtype == DType::F32) {
    for (int64_t t = 0; t < T; ++t) {
      float* dst = out.data<float>() + t * C;
      const float* first = nullptr;
      int num_added = 0;
      for (int d = 0; d < R; ++d) {
        const int32_t row = h.send_row[size_t(t) * R + d];
        if (row < 0) continue;
        const auto* src =
            reinterpret_cast<const float*>(block[size_t(d)] + size_t(row) * row_bytes);
        if (num_added == 0) first = src;
        else if (num_added == 1) sum2_f32_rows(dst, first, src, C);
        else add_f32_row(dst, src, C);
        ++num_added;
      }
      if (num_added == 0) std::memset(dst, 0, row_bytes);
      else if (num_added == 1) std::memcpy(dst, first, row_bytes);
    }
    return;
  }
  accumulator_.resize(size_t(C));
  float* acc = accumulator_.data();
  for (int64_t t = 0; t < T; ++t) {
    uint16_t* dst = out.data<uint16_t>() + t * C;
    // Contributions in rank order; fp32 sum, one rounding.
    const uint16_t* src[2] = {nullptr, nullptr};
    int num_added = 0;
    for (int d = 0; d < R; ++d) {
      const int32_t row = h.send_row[size_t(t) * R + d];
      if (row < 0) continue;
      const auto* p = reinterpret_cast<const uint16_t*>(block[size_t(d)] + size_t(row) * row_bytes);
      if (num_added < 2) src[num_added] = p;
      else if (num_added == 2) {
        sum_bf16_rows(acc, src[0], src[1], C);
        add_bf16_row(acc, p, C);
      } else {
        add_bf16_row(acc, p, C);
      }
      ++num_added;
    }
    // A single contribution is copied as is: rounding a bf16 value to bf16 is exact.
    if (num_added == 0) std::memset(dst, 0, row_bytes);
    else if (num_added == 1) std::memcpy(dst, src[0], row_bytes);
    else if (num_added == 2) sum2_bf16_rows(dst, src[0], src[1], C);
    else store_bf16_row(dst, acc, C);
  }
}

}  // namespace moerl::ep
