// Fabric: one libfabric RDM endpoint with its CQ and a table address vector in which peer
// r has fi_addr_t r. Only features the efa provider also offers are used: RDM endpoints,
// tagged send/recv with directed receives, provider-chosen memory registration (FI_MR_LOCAL
// honoured when asked).
//
// Every receive names the peer it is for (FI_DIRECTED_RECV): it matches only messages from
// that peer's address, the one the peer published through the authenticated rendezvous
// (bootstrap.h). A message from any other endpoint (one that never joined the rendezvous)
// matches no receive, whatever its tag: it is never taken as a peer's data.
// Internal to transport/: the Communicator is the public face.
#pragma once

#include <rdma/fabric.h>     // fi_info, fi_context2, fid_* handles
#include <rdma/fi_domain.h>  // fid_mr

#include <cstdint>  // uint8_t, uint64_t
#include <string>
#include <vector>

namespace moerl::transport {

struct Completion {
  void* context;  // the fi_context2 passed when posting
  bool ok;
  size_t bytes;       // bytes received (receives; sends: as posted)
  std::string error;  // provider's message when !ok
};

class Fabric {
 public:
  // provider: "efa" | "tcp" | "shm". local_ip: interface for tcp (ignored otherwise).
  // rank names this endpoint in messages. register_all: register every buffer even when the
  // provider does not ask for it (exercises the efa path elsewhere).
  Fabric(const std::string& provider, const std::string& local_ip, int rank, bool register_all);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  std::vector<uint8_t> address() const;
  void insert_peers(const std::vector<std::vector<uint8_t>>& addresses);
  std::string provider_name() const;

  // Memory registration, needed only when the provider asks for FI_MR_LOCAL (efa).
  bool needs_local_mr() const { return needs_local_mr_; }
  fid_mr* register_memory(void* data, size_t bytes, bool is_send);
  static void* descriptor(fid_mr* mr);
  static void deregister(fid_mr* mr);

  // Return 0 when posted, -FI_EAGAIN when the caller must drive progress and retry.
  int try_send(int peer, const void* data, size_t bytes, void* desc, uint64_t tag,
               fi_context2* ctx);
  // Matches only a message from `peer`'s address with exactly this tag.
  int try_recv(int peer, void* data, size_t bytes, void* desc, uint64_t tag, fi_context2* ctx);
  // Reaps up to max completions (drives progress); returns how many were written.
  size_t poll(Completion* out, size_t max);
  size_t max_msg_size() const { return max_msg_size_; }

 private:
  void check_private_region() const;  // shm: the region is this uid's alone (fabric.cc)

  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::vector<fi_addr_t> peers_;
  bool needs_local_mr_ = false;
  uint64_t next_mr_key_ = 1;  // unique keys for providers that do not pick their own
  size_t max_msg_size_ = 0;
  int rank_;
  std::string shm_region_;  // shm only: this endpoint's region in /dev/shm
};

}  // namespace moerl::transport
