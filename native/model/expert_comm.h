// The model's door to the EP core (ep/ep.h): dispatch tokens to the ranks holding their
// experts, combine expert outputs back, allreduce dense gradients. It converts between the
// model's int32 expert ids and the EP core's int64 ones and counts EP bytes and time for
// the step metrics. World size 1 runs the same EP calls without any network.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ep/ep.h"
#include "transport/communicator.h"

namespace moerl::model {

// Result of a dispatch on the expert side, plus the routes needed to go back.
struct Dispatched {
  int num_recv = 0;           // Nr rows received by this rank
  std::vector<int32_t> idx;   // [Nr,K] local expert id, -1 = slot served elsewhere
  ep::DispatchOut out;        // recv_x [Nr,C], recv_topk_weights [Nr,K], handle
  const float* x() const { return out.recv_x.data<float>(); }
  const float* w() const { return out.recv_topk_weights.data(); }
};

struct CommStats {
  double seconds = 0.0;  // wall time inside dispatch/combine/allreduce
  uint64_t bytes = 0;    // payload bytes handed to the EP core (sent rows, all ranks' view)
};

class ExpertComm {
 public:
  ExpertComm(transport::Communicator& comm, int num_experts);

  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.world_size(); }
  int first_expert() const { return rank() * num_local_experts(); }
  int num_local_experts() const { return buffer_.num_local_experts(); }
  transport::Communicator& communicator() { return comm_; }

  // x [N,C], topk_idx [N,K] global expert ids, topk_w [N,K] -> out (rows for local experts).
  void dispatch(const float* x, int N, int C, const int32_t* topk_idx, const float* topk_w, int K,
                Dispatched& out);
  // Send another [N,C2] tensor along the routes of `d`: recv [Nr,C2].
  void dispatch_cached(const float* x, int C2, const Dispatched& d, std::vector<float>& recv);
  // y [Nr,C2] on the expert side -> out [N,C2] summed over ranks in a fixed order.
  void combine(const float* y, int C2, const Dispatched& d, float* out);
  // In-place sum over ranks (dense gradients, metrics), rank order: bitwise equal everywhere.
  void allreduce_sum(float* data, size_t n);
  void barrier() { comm_.barrier(); }

  CommStats stats;

 private:
  transport::Communicator& comm_;
  ep::Buffer buffer_;
  ep::Layout layout_;
  std::vector<ep::topk_idx_t> idx64_;
  ep::Tensor scratch_;
};

}  // namespace moerl::model
