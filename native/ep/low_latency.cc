// Low-latency dispatch (see low_latency.h): quantize each token once (fp8), then pack every (token,
// top-k slot) pair into the message of its destination, grouped by the destination's local expert,
// behind a header with the counts and fp8 scales. Packed (small slot messages,
// low_latency_detail.h): post ONE message per peer, received at full capacity; the receiver copies
// each expert's rows into its slot (the slot layout of recv_x is public, so the views cannot point
// into the message). Per slot: one message per (peer, local expert) straight into the peer's slot,
// plus the header as a signal. Receives are posted at the same time as the sends, so nothing waits
// for a count before the payload moves.
//
// Tags: packed, a dispatch takes one operation number (part 0). Per slot, it takes
// ceil(L/256)+1: (op + e/256, part e%256) is the message for local expert e, the last
// operation carries the signal. Combine (either way one message per slot, straight from y: a
// gather into one message per peer measured slower) takes ceil(L/256).
#include "ep/low_latency.h"

#include <algorithm>  // std::min, std::max
#include <cstring>    // std::memcpy, std::memset
#include <sstream>    // overflow messages
#include <string>

#include "common/check.h"
#include "ep/low_latency_detail.h"

namespace moerl::ep {

std::string overflow_message(int source, int dest, int local_expert, int num_local_experts,
                             int count, int capacity) {
  std::ostringstream os;
  os << "low-latency dispatch: rank " << source << " routes " << count << " tokens to expert "
     << dest * num_local_experts + local_expert << " (local expert " << local_expert
     << " of rank " << dest << "), above the slot capacity of " << capacity
     << " tokens per (expert, source rank); raise num_max_tokens_per_slot (0 = "
     << "num_max_dispatch_tokens_per_rank) or send fewer tokens per call";
  return os.str();
}

const char* LowLatencyBuffer::transport_path() const {
  return num_ranks() == 1 ? "local" : "tagged";
}

LowLatencyBuffer::LowLatencyBuffer(transport::Communicator& comm, const LowLatencyConfig& config)
    : comm_(comm), config_(config) {
  const int R = comm_.world_size();
  const LowLatencyConfig& c = config_;
  MOERL_CHECK_INPUT(c.num_max_dispatch_tokens_per_rank > 0, "low-latency buffer: "
                    "num_max_dispatch_tokens_per_rank must be positive, got ",
                    c.num_max_dispatch_tokens_per_rank);
  MOERL_CHECK_INPUT(c.hidden > 0, "low-latency buffer: hidden must be positive, got ", c.hidden);
  MOERL_CHECK_INPUT(c.num_experts > 0 && c.num_experts % R == 0, "low-latency buffer: "
                    "num_experts (", c.num_experts, ") must be a positive multiple of the ", R,
                    " ranks");
  MOERL_CHECK_INPUT(c.num_topk > 0, "low-latency buffer: num_topk must be positive, got ",
                    c.num_topk);
  MOERL_CHECK_INPUT(c.num_max_tokens_per_slot >= 0, "low-latency buffer: "
                    "num_max_tokens_per_slot must be >= 0 (0 = T_max), got ",
                    c.num_max_tokens_per_slot);
  MOERL_CHECK_INPUT(c.dispatch_dtype != DType::F8E4M3 || c.hidden % kFp8BlockSize == 0,
                    "low-latency buffer: fp8 dispatch needs hidden % 128 == 0, got ", c.hidden);
  const int L = num_local_experts();
  const int64_t T_max = c.num_max_dispatch_tokens_per_rank, K = c.num_topk, C = c.hidden;
  const int64_t S = c.dispatch_dtype == DType::F8E4M3 ? C / kFp8BlockSize : 0;
  capacity_ = c.num_max_tokens_per_slot > 0 ? c.num_max_tokens_per_slot : int(T_max);
  row_bytes_ = size_t(C) * dtype_bytes(c.dispatch_dtype);
  // A source sends at most T_max*K pairs in all and at most P per expert, so each message
  // is bounded by that, whatever the routing; combine's returns likewise (fp32 rows at most).
  const size_t max_rows = size_t(std::min<int64_t>(T_max * K, int64_t(L) * capacity_));
  const size_t message_bytes = message::bytes(L, max_rows, row_bytes_, size_t(S));
  packed_ = packs_per_peer(c, row_bytes_);
  // A message is received at full capacity while the sender sends only the rows it has: both
  // must be one chunk for the communicator (it splits above 1 GiB).
  MOERL_CHECK_INPUT(!packed_ || message_bytes <= (size_t(1) << 30), "low-latency buffer: a "
                    "per-peer message of up to ", max_rows, " rows x ", row_bytes_, " bytes "
                    "exceeds 1 GiB; lower num_max_dispatch_tokens_per_rank or "
                    "num_max_tokens_per_slot");
  MOERL_CHECK_INPUT(packed_ || size_t(capacity_) * row_bytes_ <= (size_t(1) << 30),
                    "low-latency buffer: a slot of ", capacity_, " rows x ", row_bytes_,
                    " bytes exceeds 1 GiB; lower num_max_tokens_per_slot");
  const int64_t slot_rows = int64_t(L) * R * capacity_;
  recv_x_.resize(size_t(slot_rows) * row_bytes_);
  recv_x_scales_.resize(size_t(slot_rows * S));
  recv_count_.assign(size_t(L) * R, 0);
  num_recv_tokens_per_expert_.assign(size_t(L), 0);
  pair_row_.assign(size_t(T_max * K), -1);
  fp8_x_.resize(S > 0 ? size_t(T_max * C) : 0);
  fp8_scales_.resize(size_t(T_max * S));
  combine_offset_.assign(size_t(R) * L + 1, 0);
  accumulator_.assign(size_t(C), 0.0f);
  reduce_rows_.assign(size_t(K), nullptr);
  reduce_weights_.assign(size_t(K), 0.0f);
  peers_.resize(size_t(R));
  const size_t max_pairs = size_t(T_max * K);
  for (int r = 0; r < R; ++r) {
    Peer& p = peers_[size_t(r)];
    p.count.assign(size_t(L), 0);
    p.offset.assign(size_t(L) + 1, 0);
    if (r == comm_.rank()) continue;
    p.send_msg.resize(message_bytes);
    p.recv_msg.resize(packed_ ? message_bytes : message::signal_bytes(L, max_rows, size_t(S)));
  }
  if (R > 1) combine_recv_.resize(max_pairs * size_t(C) * sizeof(float));
}

LowLatencyBuffer::~LowLatencyBuffer() = default;

void LowLatencyBuffer::dispatch(TensorView x, const topk_idx_t* topk_idx, LowLatencyRecv& out) {
  dispatch_send(x, topk_idx);
  dispatch_recv(out);
}

void LowLatencyBuffer::dispatch_send(TensorView x, const topk_idx_t* topk_idx) {
  MOERL_CHECK_INPUT(state_ == 0 || state_ == 2, "low-latency dispatch_send: this buffer's "
                    "previous ", state_ == 1 ? "dispatch" : "combine", " is still in flight (call ",
                    state_ == 1 ? "dispatch_recv" : "combine_recv", " first)");
  const int R = num_ranks(), self = comm_.rank(), L = num_local_experts(), P = capacity_;
  const int K = config_.num_topk, E = config_.num_experts;
  const int64_t T = x.rows, C = config_.hidden;
  const bool is_fp8 = config_.dispatch_dtype == DType::F8E4M3;
  const int64_t S = is_fp8 ? C / kFp8BlockSize : 0;
  MOERL_CHECK_INPUT(T >= 0 && T <= config_.num_max_dispatch_tokens_per_rank, "low-latency "
                    "dispatch: ", T, " tokens on rank ", self, ", above "
                    "num_max_dispatch_tokens_per_rank = ",
                    config_.num_max_dispatch_tokens_per_rank);
  MOERL_CHECK_INPUT(x.cols == C, "low-latency dispatch: x has ", x.cols, " channels, the buffer ",
                    C);
  MOERL_CHECK_INPUT(is_fp8 ? (x.dtype == DType::F32 || x.dtype == DType::BF16)
                           : x.dtype == config_.dispatch_dtype,
                    "low-latency dispatch: x is ", dtype_name(x.dtype), " but the buffer "
                    "dispatches ", dtype_name(config_.dispatch_dtype),
                    is_fp8 ? " (quantized from f32 or bf16)" : "");
  MOERL_CHECK_INPUT(T == 0 || (x.data != nullptr && topk_idx != nullptr),
                    "low-latency dispatch: x and topk_idx are required");

  // Pass 1: each pair's row in its slot (ascending token order per slot), counts per peer.
  for (Peer& p : peers_) std::fill(p.count.begin(), p.count.end(), 0);
  for (int64_t i = 0; i < T * K; ++i) {
    const topk_idx_t e = topk_idx[i];
    MOERL_CHECK_INPUT(e >= -1 && e < E, "low-latency dispatch: topk_idx[", i / K, ", ", i % K,
                      "] = ", e, " on rank ", self, " is outside [-1, ", E, ")");
    pair_row_[size_t(i)] = e < 0 ? -1 : peers_[size_t(e / L)].count[size_t(e % L)]++;
  }
  overflow_ = Overflow{};
  for (int r = 0; r < R; ++r) {
    Peer& p = peers_[size_t(r)];
    for (int e = 0; e < L; ++e) {
      if (p.count[size_t(e)] > P && overflow_.rank < 0) overflow_ = {r, e, p.count[size_t(e)]};
      p.offset[size_t(e) + 1] = p.offset[size_t(e)] + std::min(p.count[size_t(e)], P);
    }
  }

  // Pass 2 (fp8): quantize each token once into fp8_x_ [T, C] + fp8_scales_ [T, S]; with
  // top-K a token has up to K pairs, and quantizing costs several memcpys of its row. Tokens
  // with no expert are skipped.
  const uint8_t* xb = static_cast<const uint8_t*>(x.data);
  const size_t x_row_bytes = size_t(C) * dtype_bytes(x.dtype);
  for (int64_t t = 0; t < (is_fp8 ? T : 0); ++t) {
    bool routed = false;
    for (int k = 0; k < K; ++k) routed |= topk_idx[t * K + k] >= 0;
    if (!routed) continue;
    const uint8_t* src = xb + size_t(t) * x_row_bytes;
    uint8_t* q = fp8_x_.data() + size_t(t * C);
    float* scales = fp8_scales_.data() + t * S;
    if (x.dtype == DType::F32)
      quantize_fp8_row(reinterpret_cast<const float*>(src), C, q, scales);
    else
      quantize_fp8_row(reinterpret_cast<const uint16_t*>(src), C, accumulator_.data(), q, scales);
  }

  // Pass 3: pack, one copy of the token's row [C] (and fp8 scales [S]) per pair; this rank's
  // own pairs go straight into its slots.
  const uint8_t* rows_src = is_fp8 ? fp8_x_.data() : xb;  // [T, row_bytes_]
  for (int64_t i = 0; i < T * K; ++i) {
    const topk_idx_t e = topk_idx[i];
    const int32_t pos = pair_row_[size_t(i)];
    if (e < 0 || pos >= P) continue;
    const int r = int(e / L), le = int(e % L);
    Peer& p = peers_[size_t(r)];
    uint8_t* dst;
    float* scales;
    if (r == self) {
      const int64_t row = (int64_t(le) * R + self) * P + pos;
      dst = recv_x_.data() + size_t(row) * row_bytes_;
      scales = recv_x_scales_.data() + row * S;
    } else {
      const int64_t row = p.offset[size_t(le)] + pos;
      dst = message::rows(p.send_msg.data(), L, size_t(p.offset[size_t(L)]), size_t(S)) +
            size_t(row) * row_bytes_;
      scales = message::scales(p.send_msg.data(), L) + row * S;
    }
    const int64_t t = i / K;
    std::memcpy(dst, rows_src + size_t(t) * row_bytes_, row_bytes_);
    if (is_fp8) std::memcpy(scales, fp8_scales_.data() + t * S, size_t(S) * sizeof(float));
  }
  for (int e = 0; e < L; ++e)
    recv_count_[size_t(e) * R + self] = std::min(peers_[size_t(self)].count[size_t(e)], P);

  // Post: per peer the receive of its message (packed: all of it; per slot: its signal,
  // and the slots), then the sends.
  const int expert_ops = packed_ ? 0 : (L + 255) / 256;
  uint32_t op = 0;
  for (int i = 0; i < expert_ops + 1; ++i) {
    const uint32_t o = comm_.begin_op();
    if (i == 0) op = o;
  }
  const uint32_t signal_op = op + uint32_t(expert_ops);
  dispatch_begin_ = comm_.num_posted();
  for (int r = 0; r < R; ++r) {
    if (r == self) continue;
    Peer& p = peers_[size_t(r)];
    const size_t n = size_t(p.offset[size_t(L)]);
    message::fill(p.send_msg.data(), L, p.count.data(), overflow_.rank, overflow_.local_expert,
                  overflow_.count);
    comm_.post_recv(r, p.recv_msg.data(), p.recv_msg.size(), signal_op, 0,
                    transport::Communicator::Fill::UpTo);
    if (packed_) {
      comm_.post_send(r, p.send_msg.data(), message::bytes(L, n, row_bytes_, size_t(S)),
                      signal_op, 0);
      continue;
    }
    for (int e = 0; e < L; ++e) {
      const int64_t row = (int64_t(e) * R + r) * P;
      comm_.post_recv(r, recv_x_.data() + size_t(row) * row_bytes_, size_t(P) * row_bytes_,
                      op + uint32_t(e / 256), e % 256, transport::Communicator::Fill::UpTo);
    }
    const uint8_t* rows = message::rows(p.send_msg.data(), L, n, size_t(S));
    for (int e = 0; e < L; ++e) {
      const int64_t m = p.offset[size_t(e) + 1] - p.offset[size_t(e)];
      comm_.post_send(r, rows + size_t(p.offset[size_t(e)]) * row_bytes_, size_t(m) * row_bytes_,
                      op + uint32_t(e / 256), e % 256);
    }
    comm_.post_send(r, p.send_msg.data(), message::signal_bytes(L, n, size_t(S)), signal_op, 0);
  }
  dispatch_end_ = comm_.num_posted();
  topk_idx_ = topk_idx;
  num_tokens_ = T;
  state_ = 1;
}

void LowLatencyBuffer::dispatch_recv(LowLatencyRecv& out) {
  MOERL_CHECK_INPUT(state_ == 1, "low-latency dispatch_recv: no dispatch_send in flight");
  const int R = num_ranks(), self = comm_.rank(), L = num_local_experts(), P = capacity_;
  const int64_t S = config_.dispatch_dtype == DType::F8E4M3 ? config_.hidden / kFp8BlockSize : 0;
  state_ = 0;  // whatever happens below, this dispatch is over
  if (R > 1) comm_.wait_range(dispatch_begin_, dispatch_end_, "low-latency dispatch");
  // Every rank reports its own overflow to every peer, so every rank throws the same error
  // (the first overflow in source rank order), not only the two ranks involved.
  std::string overflow;
  for (int s = 0; s < R; ++s) {
    if (s == self) {
      if (overflow.empty() && overflow_.rank >= 0)
        overflow = overflow_message(self, overflow_.rank, overflow_.local_expert, L,
                                    overflow_.count, P);
      continue;
    }
    const uint8_t* m = peers_[size_t(s)].recv_msg.data();
    const int32_t* head = message::header(m);
    const int32_t* counts = message::counts(m);
    // What a peer's message says is checked before it is used: a count steers copies.
    MOERL_CHECK(head[0] == -1 || (head[0] >= 0 && head[0] < R && head[1] >= 0 && head[1] < L &&
                                  head[2] > P),
                "rank ", self, ": rank ", s, " sent a corrupt low-latency dispatch header "
                "(overflow rank ", head[0], ", local expert ", head[1], ", count ", head[2],
                "; expected rank -1 or 0..", R - 1, ", expert 0..", L - 1, ", count above ", P,
                ")");
    for (int e = 0; e < L; ++e)
      MOERL_CHECK(counts[e] >= 0 && int64_t(counts[e]) <= config_.num_max_dispatch_tokens_per_rank *
                                                            int64_t(config_.num_topk),
                  "rank ", self, ": rank ", s, " sent a corrupt low-latency dispatch count: ",
                  counts[e], " tokens for local expert ", e, " (allowed 0..",
                  config_.num_max_dispatch_tokens_per_rank * int64_t(config_.num_topk), ")");
    if (overflow.empty() && head[0] >= 0)
      overflow = overflow_message(s, head[0], head[1], L, head[2], P);
    size_t total = 0;
    for (int e = 0; e < L; ++e) total += size_t(std::min(counts[e], P));
    const uint8_t* rows = message::rows(m, L, total, size_t(S));
    const float* scales = message::scales(m, L);
    int64_t packed = 0;
    for (int e = 0; e < L; ++e) {
      const int32_t n = std::min(counts[e], P);
      recv_count_[size_t(e) * R + s] = n;
      const int64_t slot = (int64_t(e) * R + s) * P;
      if (packed_)
        std::memcpy(recv_x_.data() + size_t(slot) * row_bytes_,
                    rows + size_t(packed) * row_bytes_, size_t(n) * row_bytes_);
      if (S > 0)
        std::memcpy(recv_x_scales_.data() + slot * S, scales + packed * S,
                    size_t(n * S) * sizeof(float));
      packed += n;
    }
  }
  if (!overflow.empty()) MOERL_FAIL(BadInput, overflow);
  for (int e = 0; e < L; ++e) {
    int64_t n = 0;
    for (int s = 0; s < R; ++s) n += recv_count_[size_t(e) * R + s];
    num_recv_tokens_per_expert_[size_t(e)] = n;
  }
  out.recv_x = recv_x_.data();
  out.recv_x_scales = S > 0 ? recv_x_scales_.data() : nullptr;
  out.recv_count = recv_count_.data();
  out.num_recv_tokens_per_expert = num_recv_tokens_per_expert_.data();
  state_ = 2;
}

}  // namespace moerl::ep
