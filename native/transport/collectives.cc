// Collectives over the tagged messages: allreduce (sum, fp32), broadcast, gather, barrier.
//
// allreduce = direct reduce-scatter + allgather: rank r owns slice r, receives that slice
// from every rank, sums it in rank order 0..R-1 (the order a sequential reference uses, so
// results are bitwise reproducible) and sends the sum back to everyone. Each rank moves
// 2(R-1)/R of the data, as a ring does, in 2 steps instead of 2(R-1) — the right trade for
// the small groups of one EP world (intranode shm, or a few EFA nodes).
#include <cstdint>  // uint8_t
#include <cstring>  // std::memcpy

#include "common/check.h"
#include "transport/communicator.h"

namespace moerl::transport {

void Communicator::allreduce_sum(float* data, size_t n) {
  const int world = world_size(), self = rank();
  if (world == 1 || n == 0) return;
  auto slice_begin = [&](int r) { return n * size_t(r) / size_t(world); };
  const size_t mine = slice_begin(self), mine_len = slice_begin(self + 1) - mine;
  scratch_.resize(mine_len * size_t(world));
  // Reduce-scatter: scratch_ row s holds rank s's values of my slice.
  uint32_t op = begin_op();
  for (int s = 0; s < world; ++s) {
    if (s == self) continue;
    post_recv(s, scratch_.data() + size_t(s) * mine_len, mine_len * sizeof(float), op, 0);
    post_send(s, data + slice_begin(s), (slice_begin(s + 1) - slice_begin(s)) * sizeof(float),
              op, 0);
  }
  if (mine_len > 0)  // memcpy's pointers must be valid even for 0 bytes
    std::memcpy(scratch_.data() + size_t(self) * mine_len, data + mine, mine_len * sizeof(float));
  wait_all("allreduce (reduce-scatter)");
  for (size_t i = 0; i < mine_len; ++i) {
    float acc = scratch_[i];
    for (int s = 1; s < world; ++s) acc += scratch_[size_t(s) * mine_len + i];
    data[mine + i] = acc;
  }
  // Allgather of the reduced slices.
  op = begin_op();
  for (int s = 0; s < world; ++s) {
    if (s == self) continue;
    post_recv(s, data + slice_begin(s), (slice_begin(s + 1) - slice_begin(s)) * sizeof(float),
              op, 1);
    post_send(s, data + mine, mine_len * sizeof(float), op, 1);
  }
  wait_all("allreduce (allgather)");
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  MOERL_CHECK_INPUT(root >= 0 && root < world_size(), "broadcast root ", root,
                    " is not a rank of a world of ", world_size());
  if (world_size() == 1) return;
  const uint32_t op = begin_op();
  if (rank() == root) {
    for (int r = 0; r < world_size(); ++r)
      if (r != root) post_send(r, data, bytes, op, 0);
  } else {
    post_recv(root, data, bytes, op, 0);
  }
  wait_all("broadcast");
}

// Direct gather: R-1 receives on the root, one send elsewhere. Used for small records
// (checkpoint file digests), so the root's fan-in is no bottleneck.
void Communicator::gather(const void* send, size_t bytes, void* recv, int root) {
  MOERL_CHECK_INPUT(root >= 0 && root < world_size(), "gather root ", root,
                    " is not a rank of a world of ", world_size());
  const int self = rank();
  if (self == root && bytes > 0)
    std::memcpy(static_cast<uint8_t*>(recv) + size_t(self) * bytes, send, bytes);
  if (world_size() == 1) return;
  const uint32_t op = begin_op();
  if (self == root) {
    for (int r = 0; r < world_size(); ++r)
      if (r != root) post_recv(r, static_cast<uint8_t*>(recv) + size_t(r) * bytes, bytes, op, 0);
  } else {
    post_send(root, send, bytes, op, 0);
  }
  wait_all("gather");
}

// Dissemination barrier: ceil(log2 R) rounds; in round k rank r signals r + 2^k and waits
// for r - 2^k, so after the last round everyone has heard (transitively) from everyone.
void Communicator::barrier(double timeout_s) {
  const int world = world_size(), self = rank();
  if (world == 1) return;
  uint8_t out = 1, in = 0;
  for (int step = 1; step < world; step <<= 1) {
    const uint32_t op = begin_op();
    post_recv((self - step + world) % world, &in, 1, op, 0);
    post_send((self + step) % world, &out, 1, op, 0);
    wait_until_done(0, num_posted_, "barrier", timeout_s);
    recycle();
  }
}

}  // namespace moerl::transport
