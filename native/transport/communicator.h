// Communicator: one rank's view of the expert-parallel group. It owns the libfabric
// RDM endpoint (efa | tcp | shm), the address vector indexed by rank, and offers the
// collectives the trainer needs plus the tagged point-to-point primitives ep/ is built on.
//
// Every call is collective in the SPMD sense: all ranks call the same methods in the same
// order (each call takes an operation number from a counter that must advance identically
// everywhere). Every wait has the Config's deadline; a dead or stalled peer makes the call
// throw moerl::Error(PeerFailure or Timeout) with a message naming the rank; a rank whose
// process dies is detected through the bootstrap connections within milliseconds. If a dead
// peer leaves the shm provider spinning on a lock, the process exits with code 3 and a
// message naming the rank (see watchdog.h): a hang is never an outcome.
// world_size == 1 needs no network: no libfabric object is created.
// Not thread-safe: one thread drives a communicator (its watchdog thread is internal).
// Destruction is collective too when nothing failed: it ends with a barrier, so no rank tears
// its endpoint down while a peer still needs a message from it.
#pragma once

#include <cstddef>   // size_t
#include <cstdint>   // uint64_t
#include <memory>    // std::unique_ptr for the libfabric state
#include <string>
#include <vector>    // pool of in-flight message records

#include "common/check.h"
#include "transport/config.h"

namespace moerl::transport {

class Fabric;     // libfabric endpoint, defined in fabric.h (kept out of this header)
class Bootstrap;  // TCP rendezvous, kept open as the failure detector (bootstrap.h)
class Watchdog;   // thread running the failure detector (watchdog.h)

class Communicator {
 public:
  // Creates the endpoint and exchanges addresses through the coordinator (rank 0).
  explicit Communicator(const Config& config);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return config_.rank; }
  int world_size() const { return config_.world_size; }
  const Config& config() const { return config_; }
  // Name of the libfabric provider in use ("shm", "tcp;ofi_rxm", "efa"), "none" for one rank.
  std::string provider_name() const;
  // This rank's fabric address as its peers know it (empty for one rank); for diagnostics.
  std::vector<uint8_t> address() const;

  // ---- collectives --------------------------------------------------------------------
  // data [n] fp32, in place: every rank ends with the element-wise sum over ranks.
  // The sum is taken in rank order 0..R-1 for every element, so the result is bitwise
  // identical on all ranks and equal to a sequential reference sum.
  void allreduce_sum(float* data, size_t n);
  // data [bytes]: root's bytes are copied to every rank.
  void broadcast(void* data, size_t bytes, int root);
  // send [bytes] from every rank -> recv [R*bytes] on root, row r = rank r's bytes (recv is
  // not touched elsewhere and may be null there).
  void gather(const void* send, size_t bytes, void* recv, int root);
  // Returns once every rank has entered the barrier, waiting up to the exchange deadline
  // (Config::timeout_s), or up to timeout_s where ranks may arrive minutes apart (once each
  // has stored its outputs: tools/moe_cli.h, wait_until_stored).
  void barrier() { barrier(config_.timeout_s); }
  void barrier(double timeout_s);

  // ---- point-to-point (building blocks for ep/) ---------------------------------------
  // begin_op() returns the number of a new collective operation; messages of different
  // operations never match each other. `part` (0..255) separates the messages one
  // operation sends to the same peer. Buffers must stay valid until wait_all() returns.
  // A receive takes only a message that `peer` sent (never one from any other endpoint, even
  // with the right tag) and, unless posted with Fill::UpTo (the caller then checks what the
  // message says it holds), one that fills it exactly: a message of another length fails
  // the wait (PeerFailure, naming the peer and both lengths).
  enum class Fill { Exact, UpTo };
  uint32_t begin_op();
  void post_send(int peer, const void* data, size_t bytes, uint32_t op, int part);
  void post_recv(int peer, void* data, size_t bytes, uint32_t op, int part,
                 Fill fill = Fill::Exact);
  // Waits for every posted message; `what` names the operation in error messages.
  // After a failure the communicator is unusable (its peers are gone): later calls throw.
  void wait_all(const char* what);
  // Marks for a partial wait: num_posted() before and after posting some messages, then
  // wait_range(begin, end) returns once those are done while the others stay in flight.
  // Marks count every message posted so far, so they stay valid across waits; once nothing
  // is in flight a wait recycles the records (ep/low_latency.h never calls wait_all).
  size_t num_posted() const { return num_recycled_ + num_posted_; }
  void wait_range(size_t begin, size_t end, const char* what);

 private:
  struct Pending;  // one in-flight message, defined in communicator.cc
  void post(bool is_send, int peer, void* data, size_t bytes, uint32_t op, int part,
            Fill fill);
  void progress(const char* what);
  void wait_until_done(size_t begin, size_t end, const char* what, double timeout_s);
  void recycle();  // every posted message is done: deregister and reuse the records
  [[noreturn]] void fail(ErrorKind kind, const std::string& message);

  Config config_;
  std::unique_ptr<Bootstrap> bootstrap_;  // null when world_size == 1
  std::unique_ptr<Fabric> fabric_;        // null when world_size == 1
  std::unique_ptr<Watchdog> watchdog_;    // null when world_size == 1
  std::vector<std::unique_ptr<Pending>> pending_;  // records reused across operations
  size_t num_posted_ = 0;                          // records in use since the last wait_all
  size_t num_done_ = 0;
  size_t num_recycled_ = 0;  // messages whose records were reused (all before pending_[0])
  uint32_t next_op_ = 0;
  bool broken_ = false;        // a wait failed: peers are gone, later calls throw at once
  std::vector<float> scratch_;  // allreduce receive space, kept between calls
};

}  // namespace moerl::transport
