// dispatch: send each token once to every rank holding one of its experts.
//
// Data path per call (R ranks):
//   1. counts: one small message to and from every peer: how many rows it will receive and
//      how the block is cut into segments (see Handle);
//   2. without waiting for them, for each remote rank, runs of consecutive tokens are sent
//      directly from x; the other rows are packed into staging first (one copy) and sent as
//      one segment; the small sections (scales, topk_idx rewritten to local ids, weights)
//      are packed and sent whole;
//   3. once the counts are in, receives are posted straight into the outputs, at the row
//      offset of each source rank and segment, so received rows land in their final place;
//   4. rows for this rank are copied from x to the output directly, no staging.
// On shm with cross-memory attach the receiver's kernel copies each message once from the
// sender's memory, so a directly sent row is copied once and a packed row twice.
#include <algorithm>  // std::max
#include <cstring>    // std::memcpy
#include <limits>     // std::numeric_limits

#include "common/check.h"
#include "ep/ep.h"

namespace moerl::ep {
namespace {

constexpr int kSectionPart = Handle::kMaxSegments;  // parts >= this carry the small sections

// Staging blocks start on cache lines: keeps int64 ids aligned after 4-byte rows and keeps
// two blocks from sharing a line.
size_t align_up(size_t bytes) { return (bytes + 63) & ~size_t(63); }

// One payload travelling per token: [T, row_bytes] at src -> [N, row_bytes] at dst.
struct Section {
  const uint8_t* src;
  uint8_t* dst;
  size_t row_bytes;
  bool is_topk_idx;  // rewrite global expert ids to the destination's local ids
};

// Counts message: rows for the receiver and their segmentation.
struct CountsMessage {
  int64_t num_rows;
  int32_t num_segments;
  int32_t segment_rows[Handle::kMaxSegments];
};

// Copies the rows of `tokens` from s.src to out (runs of consecutive tokens in one memcpy),
// rewriting expert ids for rank `dest` in the topk_idx section.
void pack_rows(const Section& s, const int64_t* tokens, int64_t count, int dest,
               int num_local_experts, uint8_t* out) {
  if (!s.is_topk_idx) {
    for (int64_t i = 0; i < count;) {
      int64_t run = 1;
      while (i + run < count && tokens[i + run] == tokens[i] + run) ++run;
      std::memcpy(out + size_t(i) * s.row_bytes, s.src + size_t(tokens[i]) * s.row_bytes,
                  size_t(run) * s.row_bytes);
      i += run;
    }
    return;
  }
  const int64_t K = int64_t(s.row_bytes / sizeof(topk_idx_t));
  const topk_idx_t first = topk_idx_t(dest) * num_local_experts;
  const topk_idx_t last = first + num_local_experts;
  const auto* src = reinterpret_cast<const topk_idx_t*>(s.src);
  auto* dst = reinterpret_cast<topk_idx_t*>(out);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t k = 0; k < K; ++k) {
      const topk_idx_t e = src[tokens[i] * K + k];
      dst[i * K + k] = (e >= first && e < last) ? e - first : -1;
    }
  }
}

// Cuts the ascending token list for one destination into segments (see Handle).
// use_direct: only on shm, where a message is one kernel copy straight from the sender's
// memory; over tcp or efa every message is a rendezvous of its own, and packing a block into
// one message per peer is cheaper than many direct ones.
void segment_block(const int64_t* tokens, int64_t count, size_t row_bytes, bool use_direct,
                   Handle& h) {
  // Below ~32 KiB a message costs more (queue entry, syscall, page pinning) than packing.
  const size_t bytes_per_row = std::max<size_t>(row_bytes, 1);
  const int64_t min_direct_rows =
      use_direct ? std::max<int64_t>(
                       1, int64_t((Handle::kMinDirectBytes + bytes_per_row - 1) / bytes_per_row))
                 : std::numeric_limits<int64_t>::max();
  const int max_direct = (Handle::kMaxSegments - 1) / 2;  // direct and packed alternate
  int num_direct = 0;
  int64_t packed = 0;
  for (int64_t i = 0; i < count;) {
    int64_t run = 1;
    while (i + run < count && tokens[i + run] == tokens[i] + run) ++run;
    if (run >= min_direct_rows && num_direct < max_direct) {
      if (packed > 0) {
        h.send_segment_rows.push_back(int32_t(packed));
        h.send_segment_token.push_back(-1);
        packed = 0;
      }
      h.send_segment_rows.push_back(int32_t(run));
      h.send_segment_token.push_back(tokens[i]);
      ++num_direct;
    } else {
      packed += run;
    }
    i += run;
  }
  if (packed > 0) {
    h.send_segment_rows.push_back(int32_t(packed));
    h.send_segment_token.push_back(-1);
  }
}

// The three phases of moving every section along the handle's routes. sections[0] is the
// token payload, cut into segments; the others travel whole. Sends need only the send side
// of the handle, so dispatch posts them while the counts are still in flight.
void post_recv_rows(transport::Communicator& comm, const Handle& h, const Section* sections,
                    int num_sections, uint32_t op) {
  const int R = h.num_ranks, self = comm.rank();
  const Section& x = sections[0];
  for (int s = 0; s < R; ++s) {
    const int64_t count = h.recv_rank_prefix[s + 1] - h.recv_rank_prefix[s];
    if (s == self || count == 0) continue;
    int64_t row = h.recv_rank_prefix[s];
    for (int g = h.recv_segment_prefix[s]; g < h.recv_segment_prefix[s + 1]; ++g) {
      const int64_t rows = h.recv_segment_rows[size_t(g)];
      comm.post_recv(s, x.dst + size_t(row) * x.row_bytes, size_t(rows) * x.row_bytes, op,
                     g - h.recv_segment_prefix[s]);
      row += rows;
    }
    for (int i = 1; i < num_sections; ++i) {
      const Section& sec = sections[i];
      comm.post_recv(s, sec.dst + size_t(h.recv_rank_prefix[s]) * sec.row_bytes,
                     size_t(count) * sec.row_bytes, op, kSectionPart + i);
    }
  }
}

void post_send_rows(transport::Communicator& comm, const Handle& h, const Section* sections,
                    int num_sections, int num_local_experts, uint32_t op, HostBytes& staging) {
  const int R = h.num_ranks, self = comm.rank();
  const Section& x = sections[0];
  auto send_count = [&](int r) { return h.send_rank_prefix[r + 1] - h.send_rank_prefix[r]; };
  // Staging holds the packed segments and the small sections for every remote rank.
  size_t staging_bytes = 0;
  for (int d = 0; d < R; ++d) {
    if (d == self) continue;
    for (int i = 1; i < num_sections; ++i)
      staging_bytes += align_up(size_t(send_count(d)) * sections[i].row_bytes);
    for (int g = h.send_segment_prefix[d]; g < h.send_segment_prefix[d + 1]; ++g)
      if (h.send_segment_token[size_t(g)] < 0)
        staging_bytes += align_up(size_t(h.send_segment_rows[size_t(g)]) * x.row_bytes);
  }
  if (staging.size() < staging_bytes) staging.resize(staging_bytes);
  // Start with the next rank so that not every rank serves rank 0 first.
  size_t offset = 0;
  for (int j = 1; j < R; ++j) {
    const int d = (self + j) % R;
    const int64_t count = send_count(d);
    if (count == 0) continue;
    const int64_t* tokens = h.send_token_idx.data() + h.send_rank_prefix[d];
    int64_t row = 0;
    for (int g = h.send_segment_prefix[d]; g < h.send_segment_prefix[d + 1]; ++g) {
      const int64_t rows = h.send_segment_rows[size_t(g)], first = h.send_segment_token[size_t(g)];
      const size_t bytes = size_t(rows) * x.row_bytes;
      const int part = g - h.send_segment_prefix[d];
      if (first >= 0) {
        comm.post_send(d, x.src + size_t(first) * x.row_bytes, bytes, op, part);
      } else {
        pack_rows(x, tokens + row, rows, d, num_local_experts, staging.data() + offset);
        comm.post_send(d, staging.data() + offset, bytes, op, part);
        offset += align_up(bytes);
      }
      row += rows;
    }
    for (int i = 1; i < num_sections; ++i) {
      uint8_t* block = staging.data() + offset;
      pack_rows(sections[i], tokens, count, d, num_local_experts, block);
      comm.post_send(d, block, size_t(count) * sections[i].row_bytes, op, kSectionPart + i);
      offset += align_up(size_t(count) * sections[i].row_bytes);
    }
  }
}

// Rows for this rank go from x to the outputs directly.
void copy_own_rows(int self, const Handle& h, const Section* sections, int num_sections,
                   int num_local_experts) {
  const int64_t* own = h.send_token_idx.data() + h.send_rank_prefix[self];
  const int64_t count = h.send_rank_prefix[self + 1] - h.send_rank_prefix[self];
  for (int i = 0; i < num_sections; ++i) {
    const Section& sec = sections[i];
    pack_rows(sec, own, count, self, num_local_experts,
              sec.dst + size_t(h.recv_rank_prefix[self]) * sec.row_bytes);
  }
}

void check_payload(TensorView x, const float* x_scales, int64_t num_tokens) {
  MOERL_CHECK_INPUT(x.rows == num_tokens, "dispatch: x has ", x.rows, " rows but the layout/"
                    "handle was made for ", num_tokens, " tokens");
  MOERL_CHECK_INPUT(x.cols >= 0 && (x.rows == 0 || x.cols == 0 || x.data != nullptr),
                    "dispatch: x is null or has negative width");
  if (x.dtype == DType::F8E4M3) {
    MOERL_CHECK_INPUT(x.cols % kFp8BlockSize == 0, "dispatch: fp8 payload needs C % 128 == 0, "
                      "got C=", x.cols);
    MOERL_CHECK_INPUT(x.rows == 0 || x_scales != nullptr,
                      "dispatch: fp8 payload needs x_scales [T, C/128]");
  }
}

// Send side of the routes: tokens for each rank in ascending order, each token's row in
// those blocks, and the segmentation of every block.
void build_send_routes(int self, int R, const Layout& layout, int num_experts,
                       size_t row_bytes, bool use_direct, Handle& h) {
  const int64_t T = layout.num_tokens;
  h.num_ranks = R;
  h.num_experts = num_experts;
  h.num_tokens = T;
  h.send_rank_prefix.assign(size_t(R) + 1, 0);
  for (int r = 0; r < R; ++r)
    h.send_rank_prefix[r + 1] = h.send_rank_prefix[r] + layout.num_tokens_per_rank[size_t(r)];
  h.send_token_idx.resize(size_t(h.send_rank_prefix[R]));
  h.send_row.assign(size_t(T) * size_t(R), -1);
  std::vector<int64_t> cursor(h.send_rank_prefix.begin(), h.send_rank_prefix.end() - 1);
  for (int64_t t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      if (!layout.is_token_in_rank[size_t(t) * R + r]) continue;
      h.send_row[size_t(t) * R + r] = int32_t(cursor[size_t(r)] - h.send_rank_prefix[r]);
      h.send_token_idx[size_t(cursor[size_t(r)]++)] = t;
    }
  }
  h.send_segment_prefix.assign(size_t(R) + 1, 0);
  h.send_segment_rows.clear();
  h.send_segment_token.clear();
  for (int r = 0; r < R; ++r) {
    if (r != self)  // this rank's own rows are copied, not sent: no segments
      segment_block(h.send_token_idx.data() + h.send_rank_prefix[r],
                    h.send_rank_prefix[r + 1] - h.send_rank_prefix[r], row_bytes, use_direct,
                    h);
    h.send_segment_prefix[r + 1] = int32_t(h.send_segment_rows.size());
  }
}

// Posts the counts exchange (to[r] goes to rank r, from[r] arrives from rank r).
void post_counts(transport::Communicator& comm, const Layout& layout, const Handle& h,
                 std::vector<CountsMessage>& to, std::vector<CountsMessage>& from) {
  const int R = h.num_ranks, self = comm.rank();
  to.resize(size_t(R));
  from.resize(size_t(R));
  for (int r = 0; r < R; ++r) {
    CountsMessage& m = to[size_t(r)];
    m.num_rows = layout.num_tokens_per_rank[size_t(r)];
    m.num_segments = h.send_segment_prefix[r + 1] - h.send_segment_prefix[r];
    for (int g = 0; g < m.num_segments; ++g)
      m.segment_rows[g] = h.send_segment_rows[size_t(h.send_segment_prefix[r] + g)];
  }
  from[size_t(self)] = to[size_t(self)];
  const uint32_t op = comm.begin_op();
  for (int r = 0; r < R; ++r) {
    if (r == self) continue;
    comm.post_recv(r, &from[size_t(r)], sizeof(CountsMessage), op, 0);
    comm.post_send(r, &to[size_t(r)], sizeof(CountsMessage), op, 0);
  }
}

// A counts message steers where received rows land: every field is checked before use. Rows
// per block fit the handle's int32 rows (send_row), segments are non-empty and sum to the rows.
void check_counts(int self, int r, const CountsMessage& m) {
  constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();
  MOERL_CHECK(m.num_rows >= 0 && m.num_rows <= kMaxRows, "rank ", self, ": rank ", r,
              " sent a corrupt dispatch counts message: num_rows=", m.num_rows,
              " (allowed 0..", kMaxRows, ")");
  MOERL_CHECK(m.num_segments >= (m.num_rows > 0 ? 1 : 0) && m.num_segments <= Handle::kMaxSegments,
              "rank ", self, ": rank ", r, " sent a corrupt dispatch counts message: num_segments=",
              m.num_segments, " for ", m.num_rows, " rows (allowed ", m.num_rows > 0 ? 1 : 0,
              "..", Handle::kMaxSegments, ")");
  int64_t rows = 0;
  for (int g = 0; g < m.num_segments; ++g) {
    MOERL_CHECK(m.segment_rows[g] > 0 && m.segment_rows[g] <= m.num_rows - rows, "rank ", self,
                ": rank ", r, " sent a corrupt dispatch counts message: segment ", g, " has ",
                m.segment_rows[g], " rows (allowed 1..", m.num_rows - rows, " of num_rows=",
                m.num_rows, ")");
    rows += m.segment_rows[g];
  }
  MOERL_CHECK(rows == m.num_rows, "rank ", self, ": rank ", r, " sent a corrupt dispatch counts "
              "message: its segments hold ", rows, " rows, num_rows=", m.num_rows);
}

// Receive side of the routes, from the counts every rank sent us.
void build_recv_routes(int self, const std::vector<CountsMessage>& from, Handle& h) {
  const int R = h.num_ranks;
  h.recv_rank_prefix.assign(size_t(R) + 1, 0);
  h.recv_segment_prefix.assign(size_t(R) + 1, 0);
  h.recv_segment_rows.clear();
  for (int r = 0; r < R; ++r) {
    const CountsMessage& m = from[size_t(r)];
    if (r != self) check_counts(self, r, m);
    h.recv_rank_prefix[r + 1] = h.recv_rank_prefix[r] + m.num_rows;
    h.recv_segment_rows.insert(h.recv_segment_rows.end(), m.segment_rows,
                               m.segment_rows + m.num_segments);
    h.recv_segment_prefix[r + 1] = int32_t(h.recv_segment_rows.size());
  }
  h.num_recv_tokens = h.recv_rank_prefix[R];
}

}  // namespace

void Buffer::dispatch(TensorView x, const float* x_scales, const topk_idx_t* topk_idx,
                      const float* topk_weights, const Layout& layout, DispatchOut& out) {
  const int R = num_ranks(), self = comm_.rank(), L = num_local_experts();
  const int64_t T = layout.num_tokens;
  const int K = layout.num_topk;
  check_payload(x, x_scales, T);
  MOERL_CHECK_INPUT(layout.num_tokens_per_rank.size() == size_t(R) &&
                        layout.is_token_in_rank.size() == size_t(T) * size_t(R),
                    "dispatch: layout was made for another world size");
  MOERL_CHECK_INPUT(T == 0 || (topk_idx != nullptr && topk_weights != nullptr),
                    "dispatch: topk_idx and topk_weights are required");
  const bool is_fp8 = x.dtype == DType::F8E4M3;
  const int64_t num_blocks = is_fp8 ? x.cols / kFp8BlockSize : 0;
  Section sections[4];
  int num_sections = 0;
  sections[num_sections++] = {static_cast<const uint8_t*>(x.data), nullptr,
                              size_t(x.cols) * dtype_bytes(x.dtype), false};
  if (is_fp8)
    sections[num_sections++] = {reinterpret_cast<const uint8_t*>(x_scales), nullptr,
                                size_t(num_blocks) * sizeof(float), false};
  sections[num_sections++] = {reinterpret_cast<const uint8_t*>(topk_idx), nullptr,
                              size_t(K) * sizeof(topk_idx_t), true};
  sections[num_sections++] = {reinterpret_cast<const uint8_t*>(topk_weights), nullptr,
                              size_t(K) * sizeof(float), false};

  // Counts go out first; the payload is packed and posted while they are in flight (a send
  // that arrives before its receive waits at the receiver as a descriptor, not a copy).
  Handle& h = out.handle;
  build_send_routes(self, R, layout, num_experts_, sections[0].row_bytes,
                    comm_.provider_name() == "shm", h);
  std::vector<CountsMessage> counts_to, counts_from;
  const size_t counts_begin = comm_.num_posted();
  post_counts(comm_, layout, h, counts_to, counts_from);
  const size_t counts_end = comm_.num_posted();
  const uint32_t op = comm_.begin_op();
  post_send_rows(comm_, h, sections, num_sections, L, op, send_staging_);
  comm_.wait_range(counts_begin, counts_end, "dispatch (token counts)");
  build_recv_routes(self, counts_from, h);

  const int64_t N = h.num_recv_tokens;
  out.recv_x.resize(x.dtype, N, x.cols);
  out.recv_x_scales.resize(size_t(N * num_blocks));
  out.recv_topk_idx.resize(size_t(N) * K);
  out.recv_topk_weights.resize(size_t(N) * K);
  int i = 0;
  sections[i++].dst = out.recv_x.bytes.data();
  if (is_fp8) sections[i++].dst = reinterpret_cast<uint8_t*>(out.recv_x_scales.data());
  sections[i++].dst = reinterpret_cast<uint8_t*>(out.recv_topk_idx.data());
  sections[i++].dst = reinterpret_cast<uint8_t*>(out.recv_topk_weights.data());
  post_recv_rows(comm_, h, sections, num_sections, op);
  copy_own_rows(self, h, sections, num_sections, L);
  comm_.wait_all("dispatch");

  out.num_recv_tokens_per_expert.assign(size_t(L), 0);
  for (const topk_idx_t e : out.recv_topk_idx)
    if (e >= 0) ++out.num_recv_tokens_per_expert[size_t(e)];
}

void Buffer::dispatch(TensorView x, const float* x_scales, const Handle& handle, Tensor& recv_x,
                      std::vector<float>* recv_x_scales) {
  MOERL_CHECK_INPUT(handle.num_ranks == num_ranks() && handle.num_experts == num_experts_,
                    "dispatch: handle belongs to another communicator or expert count");
  check_payload(x, x_scales, handle.num_tokens);
  const int64_t N = handle.num_recv_tokens;
  recv_x.resize(x.dtype, N, x.cols);
  Section sections[2];
  int num_sections = 0;
  sections[num_sections++] = {static_cast<const uint8_t*>(x.data), recv_x.bytes.data(),
                              size_t(x.cols) * dtype_bytes(x.dtype), false};
  if (x.dtype == DType::F8E4M3) {
    MOERL_CHECK_INPUT(recv_x_scales != nullptr, "dispatch: fp8 payload needs recv_x_scales");
    const int64_t num_blocks = x.cols / kFp8BlockSize;
    recv_x_scales->resize(size_t(N * num_blocks));
    sections[num_sections++] = {reinterpret_cast<const uint8_t*>(x_scales),
                                reinterpret_cast<uint8_t*>(recv_x_scales->data()),
                                size_t(num_blocks) * sizeof(float), false};
  }
  const uint32_t op = comm_.begin_op();
  post_recv_rows(comm_, handle, sections, num_sections, op);
  post_send_rows(comm_, handle, sections, num_sections, num_local_experts(), op, send_staging_);
  copy_own_rows(comm_.rank(), handle, sections, num_sections, num_local_experts());
  comm_.wait_all("dispatch");
}

}  // namespace moerl::ep
