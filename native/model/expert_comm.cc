// ExpertComm: world size 1 for now (rows stay on this rank); the EP core plugs in here.
#include "model/expert_comm.h"

#include <algorithm>  // std::copy

#include "common/check.h"

namespace moerl::model {

ExpertComm::ExpertComm(int rank, int world_size, int num_experts)
    : rank_(rank), world_size_(world_size), num_experts_(num_experts) {
  MOERL_CHECK_INPUT(world_size > 0 && num_experts % world_size == 0, "num_experts ", num_experts,
                    " must be divisible by the EP world size ", world_size);
  MOERL_CHECK(world_size == 1, "multi-rank EP is not wired yet");
}

void ExpertComm::dispatch(const float* x, int N, int C, const int32_t* topk_idx,
                          const float* topk_w, int K, Dispatched& out) {
  out.num_tokens = N;
  out.top_k = K;
  out.num_recv = N;
  out.x.assign(x, x + (size_t)N * C);
  out.idx.assign(topk_idx, topk_idx + (size_t)N * K);
  out.w.assign(topk_w, topk_w + (size_t)N * K);
}

void ExpertComm::dispatch_cached(const float* x, int C2, const Dispatched& d,
                                 std::vector<float>& recv) {
  recv.assign(x, x + (size_t)d.num_tokens * C2);
}

void ExpertComm::combine(const float* y, int C2, const Dispatched& d, float* out) {
  std::copy(y, y + (size_t)d.num_recv * C2, out);
}

void ExpertComm::allreduce_sum(float*, size_t) {}

}  // namespace moerl::model
