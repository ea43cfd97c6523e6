// Low-latency combine (see low_latency.h): the expert side sends every slot's rows back to
// their source straight from y (a slot is contiguous there); the source already knows how
// many rows each (rank, expert) returns (it sent them), so it posts exact receives into one
// packed block and reduces each token's K outputs in top-k slot order, reading its own
// experts' rows from y in place. Fixed order, fp32 accumulation, one rounding: bitwise equal
// to a sequential reference whatever order the messages arrive in.
#include <algorithm>  // std::fill, std::min
#include <cstring>    // std::memset

#include "common/check.h"
#include "ep/dtype.h"  // bf16_to_f32, f32_to_bf16
#include "ep/low_latency_detail.h"

namespace moerl::ep {
namespace {

MOERL_LL_KERNEL void axpy_f32_row(float* acc, float w, const float* y, int64_t C) {
  for (int64_t c = 0; c < C; ++c) acc[c] += w * y[c];
}

MOERL_LL_KERNEL void axpy_bf16_row(float* acc, float w, const uint16_t* y, int64_t C) {
  for (int64_t c = 0; c < C; ++c) acc[c] += w * bf16_to_f32(y[c]);
}

MOERL_LL_KERNEL void store_bf16_row(uint16_t* dst, const float* acc, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dst[c] = f32_to_bf16(acc[c]);
}

}  // namespace

void LowLatencyBuffer::combine(TensorView y, const float* topk_weights, Tensor& out) {
  combine_send(y);
  combine_recv(topk_weights, out);
}

void LowLatencyBuffer::combine_send(TensorView y) {
  MOERL_CHECK_INPUT(state_ == 2, "low-latency combine_send: needs a completed dispatch on this "
                    "buffer (dispatch_recv) and no combine in flight");
  const int R = num_ranks(), self = comm_.rank(), L = num_local_experts(), P = capacity_;
  const int64_t C = config_.hidden;
  MOERL_CHECK_INPUT(y.dtype == DType::F32 || y.dtype == DType::BF16, "low-latency combine: y "
                    "must be f32 or bf16, got ", dtype_name(y.dtype));
  MOERL_CHECK_INPUT(y.rows == int64_t(L) * R * P && y.cols == C, "low-latency combine: y is [",
                    y.rows, ", ", y.cols, "] but the slot layout is [L*R*P, C] = [",
                    int64_t(L) * R * P, ", ", C, "]");
  MOERL_CHECK_INPUT(y.data != nullptr, "low-latency combine: y is required");
  const size_t y_row_bytes = size_t(C) * dtype_bytes(y.dtype);
  const int expert_ops = (L + 255) / 256;
  uint32_t op = 0;
  for (int i = 0; i < expert_ops; ++i) {
    const uint32_t o = comm_.begin_op();
    if (i == 0) op = o;
  }
  combine_begin_ = comm_.num_posted();
  // Returns from rank r's expert e land at rows combine_offset_[r*L+e] of combine_recv_.
  int64_t row = 0;
  for (int r = 0; r < R; ++r) {
    const Peer& p = peers_[size_t(r)];
    for (int e = 0; e < L; ++e) {
      combine_offset_[size_t(r) * L + e] = row;
      if (r == self) continue;
      const int64_t n = p.offset[size_t(e) + 1] - p.offset[size_t(e)];
      if (n > 0)
        comm_.post_recv(r, combine_recv_.data() + size_t(row) * y_row_bytes,
                        size_t(n) * y_row_bytes, op + uint32_t(e / 256), e % 256);
      row += n;
    }
  }
  const uint8_t* yb = static_cast<const uint8_t*>(y.data);
  for (int s = 0; s < R; ++s) {
    if (s == self) continue;
    for (int e = 0; e < L; ++e) {
      const int32_t n = recv_count_[size_t(e) * R + s];
      if (n > 0)
        comm_.post_send(s, yb + size_t((int64_t(e) * R + s) * P) * y_row_bytes,
                        size_t(n) * y_row_bytes, op + uint32_t(e / 256), e % 256);
    }
  }
  combine_end_ = comm_.num_posted();
  combine_y_ = y.data;
  combine_dtype_ = y.dtype;
  state_ = 3;
}

void LowLatencyBuffer::combine_recv(const float* topk_weights, Tensor& out) {
  MOERL_CHECK_INPUT(state_ == 3, "low-latency combine_recv: no combine_send in flight");
  const int R = num_ranks(), self = comm_.rank(), L = num_local_experts(), P = capacity_;
  const int K = config_.num_topk;
  const int64_t T = num_tokens_, C = config_.hidden;
  state_ = 0;
  if (R > 1) comm_.wait_range(combine_begin_, combine_end_, "low-latency combine");
  const bool is_bf16 = combine_dtype_ == DType::BF16;
  const size_t y_row_bytes = size_t(C) * dtype_bytes(combine_dtype_);
  const uint8_t* y = static_cast<const uint8_t*>(combine_y_);
  out.resize(combine_dtype_, T, C);
  // Per token: its rows and weights in slot order, then the sum over channel chunks that stay
  // in L1 while every row adds into them (same per-element order: k = 0..K-1).
  constexpr int64_t kChunk = 1024;
  float* acc = accumulator_.data();
  for (int64_t t = 0; t < T; ++t) {
    int num_rows = 0;
    for (int k = 0; k < K; ++k) {
      const topk_idx_t e = topk_idx_[t * K + k];
      if (e < 0) continue;
      const int r = int(e / L), le = int(e % L);
      const int64_t pos = pair_row_[size_t(t * K + k)];
      reduce_rows_[size_t(num_rows)] =
          r == self ? y + size_t((int64_t(le) * R + self) * P + pos) * y_row_bytes
                    : combine_recv_.data() +
                          size_t(combine_offset_[size_t(r) * L + le] + pos) * y_row_bytes;
      reduce_weights_[size_t(num_rows++)] =
          topk_weights != nullptr ? topk_weights[t * K + k] : 1.0f;
    }
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t n = std::min(kChunk, C - c0);
      std::fill(acc, acc + n, 0.0f);
      for (int i = 0; i < num_rows; ++i) {
        const float w = reduce_weights_[size_t(i)];
        const uint8_t* row = reduce_rows_[size_t(i)];
        if (is_bf16) axpy_bf16_row(acc, w, reinterpret_cast<const uint16_t*>(row) + c0, n);
        else axpy_f32_row(acc, w, reinterpret_cast<const float*>(row) + c0, n);
      }
      if (is_bf16) store_bf16_row(out.data<uint16_t>() + t * C + c0, acc, n);
      else std::memcpy(out.data<float>() + t * C + c0, acc, size_t(n) * sizeof(float));
    }
  }
  state_ = 2;  // the dispatch's slots and routes stay valid: another combine may follow
}

}  // namespace moerl::ep
