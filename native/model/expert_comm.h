// The model's door to the EP core: dispatch tokens to the ranks holding their experts,
// combine expert outputs back, and allreduce dense gradients. Keeps the model code free
// of transport details and counts EP bytes and time for the step metrics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moerl::model {

// Result of a dispatch on the expert side, plus the routes needed to go back.
struct Dispatched {
  int num_recv = 0;             // Nr rows received by this rank
  std::vector<float> x;         // [Nr,C] received token rows
  std::vector<int32_t> idx;     // [Nr,K] local expert id, -1 = slot served elsewhere
  std::vector<float> w;         // [Nr,K] router weights for the local slots
  int num_tokens = 0;           // N tokens this rank sent from
  int top_k = 0;
};

struct CommStats {
  double seconds = 0.0;  // wall time inside dispatch/combine/allreduce
  uint64_t bytes = 0;    // payload bytes handed to the EP core
};

class ExpertComm {
 public:
  // rank / world_size from the transport; experts sharded contiguously over ranks.
  ExpertComm(int rank, int world_size, int num_experts);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int first_expert() const { return rank_ * (num_experts_ / world_size_); }
  int num_local_experts() const { return num_experts_ / world_size_; }

  // x [N,C], topk_idx [N,K] global expert ids, topk_w [N,K] -> out (rows for local experts).
  void dispatch(const float* x, int N, int C, const int32_t* topk_idx, const float* topk_w, int K,
                Dispatched& out);
  // Send another [N,C2] tensor along the routes of `d`: recv [Nr,C2].
  void dispatch_cached(const float* x, int C2, const Dispatched& d, std::vector<float>& recv);
  // y [Nr,C2] on the expert side -> out [N,C2] summed over ranks in a fixed order.
  void combine(const float* y, int C2, const Dispatched& d, float* out);
  // In-place sum over ranks (dense gradients, metrics).
  void allreduce_sum(float* data, size_t n);

  CommStats stats;

 private:
  int rank_, world_size_, num_experts_;
};

}  // namespace moerl::model
