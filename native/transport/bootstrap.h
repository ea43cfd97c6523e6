// Bootstrap: a small TCP rendezvous at rank 0 (MOERL_COORDINATOR) that lets every rank
// learn every other rank's libfabric address before any fabric traffic; every read, write,
// accept and connect has the start-up deadline (MOERL_STARTUP_TIMEOUT_S).
//
// Rank 0 listens on one address only (MOERL_BIND_ADDRESS, else the coordinator's host) and
// admits a connection as a rank only after a challenge-response on the job's secret
// (MOERL_JOB_TOKEN): rank 0 sends a fresh nonce, the peer answers with its rank and an
// HMAC-SHA256 under the token, and rank 0 answers the peer's own nonce the same way, so each
// side knows the other belongs to the job. Anything else that connects (a port scan, a
// health check, a rank of another job, garbage) is closed and forgotten: it fails nobody.
// Handshakes run side by side with bounded reads and a per-connection time limit, so a
// stranger that connects and says nothing cannot hold up the ranks behind it.
//
// A rank claimed twice is a replacement (a pod recreated after its predecessor was lost),
// never bad input: if the admitted one has hung up, the replacement takes its place (nothing
// has been exchanged yet); if it is still connected, the rendezvous attempt ends with
// Error(PeerFailure) on rank 0 and every admitted rank (tools: exit 75), and the whole job
// restarts and meets again. An attempt is one rank 0 process: a rank of an earlier attempt
// fails with its rank 0 and can only take part in the next one by starting over.
//
// Its connections (rank 0 to every rank) then stay open for the communicator's life as a
// failure detector: the kernel closes a dead process's sockets, so rank 0 learns at once
// which rank died and tells the others, and everyone names the dead rank itself instead of
// only "a peer I was waiting for" (which, in a stalled group, is often a live rank that
// waits for the dead one).
#pragma once

#include <cstdint>     // uint8_t
#include <functional>  // std::function for the peer-died hook
#include <string>
#include <vector>

#include "transport/config.h"

namespace moerl::transport {

class Bootstrap {
 public:
  // Rank 0 listens on the coordinator's port and admits world_size - 1 peers; the others
  // connect (retrying until the start-up deadline while rank 0 is not yet up or refuses
  // them). Port 0: rank 0 listens on a port the kernel picks and publishes it in
  // coordinator_port_file, which the others read (waiting for it within the same deadline).
  // Throws Error(Timeout) at the deadline, naming the ranks missing and, when it refused
  // connections, that they could not prove the token.
  explicit Bootstrap(const Config& config);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  // IPv4 address of the local interface that reaches the coordinator (the interface the
  // tcp provider should bind to, so pods pick their pod network and not loopback).
  const std::string& local_ip() const { return local_ip_; }

  // Every rank passes its blob; every rank gets all blobs indexed by rank.
  std::vector<std::vector<uint8_t>> allgather(const std::vector<uint8_t>& mine);

  // Non-blocking look at the connections; throws moerl::Error(PeerFailure) naming the rank
  // when a peer died or announced a failure.
  void check_peers();
  // Announces that this rank leaves: cleanly (its work is done) or after a failure.
  void leave(bool clean) noexcept;

  // Called (from check_peers) with the rank whose connection closed without a goodbye,
  // i.e. whose process is gone; used to remove what the dead process left behind.
  std::function<void(int)> on_peer_died;

 private:
  void admit_peers(const std::string& host, const std::string& port);  // rank 0
  void join_coordinator(const std::string& host, const std::string& port);  // the others
  void close_sockets() noexcept;

  Config config_;
  double deadline_;             // monotonic seconds: the start-up deadline
  int listen_fd_ = -1;          // rank 0 only
  std::vector<int> peer_fds_;   // rank 0: socket of rank r at [r]; others: [0] = rank 0
  std::vector<bool> departed_;  // by socket index: peer left cleanly, its EOF is expected
  std::vector<std::string> partial_;  // by socket index: bytes of an incomplete notice
  std::string local_ip_;
};

}  // namespace moerl::transport
