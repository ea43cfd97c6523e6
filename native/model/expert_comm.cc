// ExpertComm: thin adapter from the MoE block to ep::Buffer and the communicator.
#include "model/expert_comm.h"

#include <algorithm>  // std::copy_n
#include <chrono>     // steady_clock for EP time

#include "common/check.h"

namespace moerl::model {
namespace {

struct Timer {
  CommStats& stats;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~Timer() {
    stats.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// Rows a cached dispatch sends to other ranks (rows for this rank are copied locally).
int64_t remote_rows_sent(const ep::Handle& h, int self) {
  return h.send_rank_prefix[h.num_ranks] - (h.send_rank_prefix[self + 1] - h.send_rank_prefix[self]);
}

// Rows a combine returns to other ranks.
int64_t remote_rows_returned(const ep::Handle& h, int self) {
  return h.recv_rank_prefix[h.num_ranks] - (h.recv_rank_prefix[self + 1] - h.recv_rank_prefix[self]);
}

}  // namespace

ExpertComm::ExpertComm(transport::Communicator& comm, int num_experts)
    : comm_(comm), buffer_(comm, num_experts) {
  MOERL_CHECK_INPUT(num_experts > 0 && num_experts % comm.world_size() == 0, "num_experts ",
                    num_experts, " must be divisible by the EP world size ", comm.world_size());
}

void ExpertComm::dispatch(const float* x, int N, int C, const int32_t* topk_idx,
                          const float* topk_w, int K, Dispatched& d) {
  Timer timer{stats};
  idx64_.assign(topk_idx, topk_idx + (size_t)N * K);
  buffer_.get_dispatch_layout(idx64_.data(), N, K, layout_);
  buffer_.dispatch({x, ep::DType::F32, N, C}, nullptr, idx64_.data(), topk_w, layout_, d.out);
  d.num_recv = (int)d.out.handle.num_recv_tokens;
  d.idx.resize(d.out.recv_topk_idx.size());
  for (size_t j = 0; j < d.idx.size(); j++) d.idx[j] = (int32_t)d.out.recv_topk_idx[j];
  for (int r = 0; r < world_size(); r++)
    if (r != rank()) stats.bytes += (uint64_t)layout_.num_tokens_per_rank[r] * C * sizeof(float);
}

void ExpertComm::dispatch_cached(const float* x, int C2, const Dispatched& d,
                                 std::vector<float>& recv) {
  Timer timer{stats};
  const ep::Handle& h = d.out.handle;
  buffer_.dispatch({x, ep::DType::F32, h.num_tokens, C2}, nullptr, h, scratch_, nullptr);
  recv.resize((size_t)d.num_recv * C2);
  std::copy_n(scratch_.data<float>(), recv.size(), recv.data());
  stats.bytes += (uint64_t)remote_rows_sent(h, rank()) * C2 * sizeof(float);
}

void ExpertComm::combine(const float* y, int C2, const Dispatched& d, float* out) {
  Timer timer{stats};
  const ep::Handle& h = d.out.handle;
  buffer_.combine({y, ep::DType::F32, h.num_recv_tokens, C2}, h, scratch_);
  std::copy_n(scratch_.data<float>(), (size_t)h.num_tokens * C2, out);
  stats.bytes += (uint64_t)remote_rows_returned(h, rank()) * C2 * sizeof(float);
}

void ExpertComm::allreduce_sum(float* data, size_t n) {
  Timer timer{stats};
  comm_.allreduce_sum(data, n);
  if (world_size() > 1) stats.bytes += n * sizeof(float);
}

}  // namespace moerl::model
