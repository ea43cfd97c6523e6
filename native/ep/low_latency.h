// Low-latency expert-parallel exchange for decode-sized batches, after DeepEP's low-latency
// mode: fixed-capacity receive slots per (local expert, source rank), allocated once with the
// buffer; every (token, top-k slot) pair lands straight in its slot (one message per
// (peer, expert), no unpacking at the receiver); one signal message per peer carries the slot
// counts (no separate count exchange, no layout round trip, no allocation per call); combine
// sends each expert output back to the source, which reduces a token's K outputs in top-k
// slot order 0..K-1 (fp32, one rounding): bitwise reproducible whatever the arrival order.
//
// Dimensions: R ranks, E experts (rank r holds [r*L, (r+1)*L)), L = E/R local experts,
// T <= T_max tokens on this rank per call, K top-k, C channels, S = C/128 fp8 scale blocks,
// P = slot capacity (rows per (local expert, source rank); default T_max).
//
// Unlike the normal mode (ep.h) a token travels once per (token, expert) pair, not once per
// destination rank, so the expert side sees one row per pair, grouped by expert.
//
// Each call is collective: every rank calls the same methods in the same order. One dispatch
// + combine is in flight per buffer; two micro-batches overlap through two buffers.
#pragma once

#include <cstdint>  // int32_t, int64_t
#include <vector>

#include "ep/ep.h"  // DType, TensorView, Tensor, topk_idx_t; transport::Communicator

namespace moerl::ep {

struct LowLatencyConfig {
  int num_max_dispatch_tokens_per_rank = 128;  // T_max: most tokens any rank passes per call
  int hidden = 0;                              // C
  int num_experts = 0;                         // E, E % R == 0
  int num_topk = 0;                            // K
  DType dispatch_dtype = DType::BF16;          // payload on the wire and in recv_x:
                                               //   F32 | BF16 (= x's dtype) | F8E4M3 (x is
                                               //   quantized on send; C % 128 == 0)
  int num_max_tokens_per_slot = 0;             // P; 0 means T_max (never overflows unless a
                                               //   token lists one expert twice)
};

// Views of the receive slots, filled by dispatch_recv(); valid until the next dispatch_send
// on the same buffer. Rows of slot (e, s) are source s's pairs routed to local expert e, in
// ascending source token order (a token listing e twice contributes two rows).
struct LowLatencyRecv {
  const void* recv_x = nullptr;        // [L, R*P, C] dispatch_dtype; slot (e, s) is rows
                                       //   [e*R*P + s*P, + recv_count[e*R+s])
  const float* recv_x_scales = nullptr;  // [L, R*P, S] fp32, F8E4M3 only (else null)
  const int32_t* recv_count = nullptr;   // [L, R] rows in slot (e, s)
  const int64_t* num_recv_tokens_per_expert = nullptr;  // [L] sum over s of recv_count
};

class LowLatencyBuffer {
 public:
  // Allocates every slot and staging block once. Local: no communication. Throws BadInput
  // naming the field for an impossible config. (On efa the communicator still registers each
  // message's memory when it is posted, as for the normal mode.)
  LowLatencyBuffer(transport::Communicator& comm, const LowLatencyConfig& config);
  ~LowLatencyBuffer();
  LowLatencyBuffer(const LowLatencyBuffer&) = delete;
  LowLatencyBuffer& operator=(const LowLatencyBuffer&) = delete;

  const LowLatencyConfig& config() const { return config_; }
  int num_ranks() const { return comm_.world_size(); }
  int num_local_experts() const { return config_.num_experts / comm_.world_size(); }
  int slot_capacity() const { return capacity_; }  // P
  // "tagged" (libfabric tagged messages into the slots; RMA is not used yet) or "local" (one
  // rank): the path the exchange takes, for logs and benchmark lines.
  const char* transport_path() const;
  // Dispatch sends one message per peer (true) or one per (peer, local expert) plus a signal
  // (false): decided from the config (low_latency_detail.h), for tests and benchmark lines.
  bool dispatch_packed() const { return packed_; }

  // ---- dispatch ----------------------------------------------------------------------
  // x [T, C] F32 | BF16 (must equal dispatch_dtype unless that is F8E4M3), T <= T_max;
  // topk_idx [T, K] expert ids in [0, E) or -1 (slot unused). Packs and posts every pair and
  // the per-peer signals, then returns: x may be reused at once; topk_idx must stay valid
  // until combine_recv returns (combine reads the routes from it).
  // Overflow of a slot (more than P pairs for one (expert, source)) is reported by
  // dispatch_recv on the source and the destination: Error(BadInput) naming the expert,
  // both ranks and P; the slot then holds its first P rows only.
  void dispatch_send(TensorView x, const topk_idx_t* topk_idx);
  // The receive hook: waits for this dispatch's pairs and signals (the deadline of the
  // communicator applies; a dead peer is named) and fills `out`. Compute of another
  // micro-batch (another buffer) may run between dispatch_send and dispatch_recv.
  void dispatch_recv(LowLatencyRecv& out);
  // dispatch_send + dispatch_recv.
  void dispatch(TensorView x, const topk_idx_t* topk_idx, LowLatencyRecv& out);

  // ---- combine -----------------------------------------------------------------------
  // y [L, R*P, C] F32 | BF16, the expert outputs in the slot layout of recv_x (rows past a
  // slot's count are ignored). Sends every slot's rows back to its source straight from y;
  // y must stay valid until combine_recv returns.
  void combine_send(TensorView y);
  // Waits for this rank's outputs and reduces: out [T, C] dtype of y,
  //   out[t] = sum over k = 0..K-1 with topk_idx[t,k] >= 0 of w[t,k] * y[row of pair (t,k)],
  // in that order, fp32 accumulation, one rounding. topk_weights [T, K] fp32, or null for
  // w = 1. Tokens with no expert get zeros. Another combine along the same dispatch may
  // follow (e.g. a second tensor); the next dispatch_send ends the dispatch.
  void combine_recv(const float* topk_weights, Tensor& out);
  // combine_send + combine_recv.
  void combine(TensorView y, const float* topk_weights, Tensor& out);

 private:
  struct Peer;  // per-peer send staging, signals and receive bookkeeping (low_latency.cc)

  transport::Communicator& comm_;
  LowLatencyConfig config_;
  int capacity_ = 0;                        // P
  size_t row_bytes_ = 0;                    // C * bytes of dispatch_dtype
  bool packed_ = false;                     // packs_per_peer(config_, row_bytes_)
  HostBytes recv_x_;                        // [L, R*P, C] slots
  std::vector<float> recv_x_scales_;        // [L, R*P, S] (fp8 only)
  std::vector<int32_t> recv_count_;         // [L, R]
  std::vector<int64_t> num_recv_tokens_per_expert_;  // [L]
  std::vector<Peer> peers_;                 // [R]
  // Routes of the dispatch in flight, kept for combine.
  const topk_idx_t* topk_idx_ = nullptr;    // [T, K] caller's
  int64_t num_tokens_ = 0;                  // T
  std::vector<int32_t> pair_row_;           // [T, K] row of pair (t, k) in its slot, -1 unused
  HostBytes fp8_x_;                         // [T_max, C] e4m3: x quantized once per token
  std::vector<float> fp8_scales_;           // [T_max, S] its scales (fp8 only)
  HostBytes combine_recv_;                  // [T_max*K, C] rows returned by remote ranks
  std::vector<int64_t> combine_offset_;     // [R, L] first row of (rank, expert) in it
  std::vector<float> accumulator_;          // [C]
  std::vector<const uint8_t*> reduce_rows_; // [K] rows of one token's pairs (combine)
  std::vector<float> reduce_weights_;       // [K] their weights
  struct Overflow {                         // first slot overflow seen by dispatch_send
    int32_t rank = -1;                      //   destination rank, -1 if none
    int32_t local_expert = 0;               //   its local expert
    int32_t count = 0;                      //   pairs routed there
  } overflow_;
  size_t dispatch_begin_ = 0, dispatch_end_ = 0;  // communicator marks of the posted messages
  size_t combine_begin_ = 0, combine_end_ = 0;
  int state_ = 0;                           // 0 idle, 1 dispatch posted, 2 received,
                                            //   3 combine posted
  const void* combine_y_ = nullptr;         // y of the combine in flight
  DType combine_dtype_ = DType::F32;
};

}  // namespace moerl::ep
