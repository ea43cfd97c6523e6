// Expert-parallel token exchange, modelled on DeepEP's normal mode:
//   get_dispatch_layout(topk_idx)          -> tokens per rank / per expert, is_token_in_rank
//   dispatch(x, topk_idx, topk_weights)    -> tokens each rank's experts need, plus a Handle
//   combine(y, handle)                     -> expert outputs summed back at the source rank
// Backward of dispatch is combine with the same handle, backward of combine is the cached
// dispatch; both accept any channel count C and any payload dtype per call.
//
// Dimensions: R ranks, E experts (E % R == 0; rank r holds experts [r*E/R, (r+1)*E/R)),
// L = E/R local experts, T tokens on this rank, K experts per token (top-k), C channels,
// N tokens received by this rank. Matrices are row-major.
//
// Each token travels once per destination rank (not once per expert). Received tokens are
// ordered by source rank, then by source token index. combine sums a token's contributions
// in destination-rank order 0..R-1 (fp32 accumulation, one rounding at the end), so results
// are bitwise reproducible and independent of timing.
#pragma once

#include <cstdint>  // int64_t, uint8_t, uint16_t
#include <vector>   // owned outputs

#include "ep/host_memory.h"  // HostBytes: large buffers on transparent huge pages
#include "transport/communicator.h"

namespace moerl::ep {

using topk_idx_t = int64_t;  // expert ids; -1 means "no expert in this slot"

enum class DType : uint8_t {
  F32 = 0,     // IEEE fp32
  BF16 = 1,    // bfloat16 stored as uint16_t (see ep/dtype.h for conversions)
  F8E4M3 = 2,  // OCP fp8 e4m3 stored as uint8_t, with one fp32 scale per 128 channels
};
size_t dtype_bytes(DType dtype);
const char* dtype_name(DType dtype);
constexpr int kFp8BlockSize = 128;  // channels sharing one fp32 scale in F8E4M3 payloads

// Non-owning view of a [rows, cols] matrix.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Owned [rows, cols] matrix; resize() keeps the allocation when the size does not grow,
// so outputs passed back into the same call are reused without new page faults. Large
// tensors live on transparent huge pages (host_memory.h).
struct Tensor {
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  HostBytes bytes;

  void resize(DType new_dtype, int64_t new_rows, int64_t new_cols);
  TensorView view() const { return {bytes.data(), dtype, rows, cols}; }
  template <typename T> T* data() { return reinterpret_cast<T*>(bytes.data()); }
  template <typename T> const T* data() const { return reinterpret_cast<const T*>(bytes.data()); }
};

struct Layout {
  int64_t num_tokens = 0;                      // T
  int num_topk = 0;                            // K
  std::vector<int64_t> num_tokens_per_rank;    // [R] tokens with at least one expert on rank r
  std::vector<int64_t> num_tokens_per_expert;  // [E] (token, slot) pairs routed to expert e
  std::vector<uint8_t> is_token_in_rank;       // [T, R] 1 if token t goes to rank r, else 0
};

// Routes of one dispatch, reused by combine and by cached dispatches (backward pass).
// Only ranks, token counts and row positions: no payload, so any C and dtype fit.
struct Handle {
  int num_ranks = 0;                              // R
  int num_experts = 0;                            // E
  int64_t num_tokens = 0;                         // T, tokens on this rank before dispatch
  int64_t num_recv_tokens = 0;                    // N, rows received by this rank
  std::vector<int64_t> recv_rank_prefix;          // [R+1] rows from source s are
                                                  //   [recv_rank_prefix[s], recv_rank_prefix[s+1])
  std::vector<int64_t> send_rank_prefix;          // [R+1] offsets into send_token_idx
  std::vector<int64_t> send_token_idx;            // [sum over r of num_tokens_per_rank[r]]
                                                  //   tokens sent to rank r, ascending
  std::vector<int32_t> send_row;                  // [T, R] row of token t within the block
                                                  //   rank r received from us, -1 if not sent
  // Each block travels as up to kMaxSegments messages ("segments", in row order). On shm, a
  // run of consecutive tokens holding at least kMinDirectBytes of x (at the C and dtype of the
  // dispatch that made the handle) is one segment sent straight from x, with no staging copy;
  // the rows between such runs are packed into one segment. Other providers pack the block
  // into one segment (there every message is a rendezvous of its own).
  static constexpr int kMaxSegments = 240;
  static constexpr size_t kMinDirectBytes = 32 << 10;
  std::vector<int32_t> send_segment_prefix;       // [R+1] segments of the block sent to rank r
                                                  //   (none for this rank's own block)
  std::vector<int32_t> send_segment_rows;         // rows of each segment
  std::vector<int64_t> send_segment_token;        // first token of a direct segment, -1 packed
  std::vector<int32_t> recv_segment_prefix;       // [R+1] segments of the block from rank s
  std::vector<int32_t> recv_segment_rows;         // rows of each received segment
};

struct DispatchOut {
  Tensor recv_x;                                   // [N, C] dtype of x
  std::vector<float> recv_x_scales;                // [N, C/128] only for F8E4M3
  std::vector<topk_idx_t> recv_topk_idx;           // [N, K] LOCAL expert id in [0, L), -1 if
                                                   //   that slot's expert is not on this rank
  std::vector<float> recv_topk_weights;            // [N, K] router weights, as sent
  std::vector<int64_t> num_recv_tokens_per_expert; // [L] received (token, slot) pairs per
                                                   //   local expert
  Handle handle;
};

// One Buffer per communicator and expert count; it keeps the staging memory between calls.
// All methods are collective: every rank calls them in the same order.
class Buffer {
 public:
  Buffer(transport::Communicator& comm, int num_experts);

  int num_ranks() const { return comm_.world_size(); }
  int num_experts() const { return num_experts_; }
  int num_local_experts() const { return num_experts_ / comm_.world_size(); }

  // topk_idx [T, K] expert ids in [0, E) or -1. Purely local, no communication.
  void get_dispatch_layout(const topk_idx_t* topk_idx, int64_t num_tokens, int num_topk,
                           Layout& layout) const;

  // x [T, C] fp32 | bf16 | fp8 (then C % 128 == 0 and x_scales [T, C/128] fp32, else null),
  // topk_idx [T, K] as given to get_dispatch_layout, topk_weights [T, K] fp32,
  // layout from get_dispatch_layout for the same topk_idx. Fills out (see DispatchOut).
  void dispatch(TensorView x, const float* x_scales, const topk_idx_t* topk_idx,
                const float* topk_weights, const Layout& layout, DispatchOut& out);

  // Cached dispatch along handle's routes (backward of combine): x [T, C] any dtype and C,
  // x_scales as above -> recv_x [N, C], recv_x_scales [N, C/128] (fp8 only; may be null
  // otherwise).
  void dispatch(TensorView x, const float* x_scales, const Handle& handle, Tensor& recv_x,
                std::vector<float>* recv_x_scales);

  // y [N, C] fp32 | bf16 rows in the order dispatch delivered them -> out [T, C] same dtype:
  // out[t] = sum over destination ranks r = 0..R-1 that received token t of y[row of t on r],
  // accumulated in fp32; tokens sent nowhere get zeros. Backward of dispatch.
  void combine(TensorView y, const Handle& handle, Tensor& out);

 private:
  transport::Communicator& comm_;
  int num_experts_;
  HostBytes send_staging_;  // packed rows for remote ranks (dispatch)
  HostBytes recv_staging_;  // rows coming back from remote ranks (combine)
  std::vector<float> accumulator_;     // [C] fp32 row accumulator (combine)
};

}  // namespace moerl::ep
