// Communicator construction and tagged point-to-point messaging with deadlines.
//
// Tag layout (60 bits, every provider we target offers at least that many):
//   [59:36] operation number (24 bits, wraps; older operations are complete by then)
//   [35:20] source rank      (16 bits)
//   [19:12] part             (8 bits, chosen by the caller)
//   [11:0]  chunk            (12 bits, messages above the provider's max_msg_size are split)
// A tag is easy to guess, so it proves nothing: each receive is also bound to the address of
// the peer it expects (fabric.h), learnt in the authenticated rendezvous, and a message must
// fill its receive exactly (a shorter one is a corrupt message, never a partial buffer).
#include "transport/communicator.h"

#include <rdma/fi_errno.h>  // FI_EAGAIN
#include <sched.h>          // sched_yield: ranks may outnumber cores, so polls give way
#include <sys/mman.h>       // shm_unlink for a dead rank's shared-memory region

#include <algorithm>  // std::min
#include <exception>  // std::uncaught_exceptions
#include <set>        // ranks named in a timeout message
#include <sstream>    // std::ostringstream
#include <thread>     // std::this_thread::sleep_for

#include "common/check.h"
#include "transport/bootstrap.h"
#include "transport/clock.h"
#include "transport/fabric.h"
#include "transport/watchdog.h"

namespace moerl::transport {

struct Communicator::Pending {
  fi_context2 context;  // first member: the provider hands this pointer back on completion
  int peer = -1;
  bool is_send = false;
  bool done = false;
  size_t bytes = 0;    // posted length
  bool exact = false;  // a receive that must get exactly `bytes`
  fid_mr* mr = nullptr;
};

namespace {

constexpr size_t kMaxChunk = size_t(1) << 30;  // 1 GiB: below every provider's limit
constexpr int kMaxChunks = 1 << 12;
constexpr int kYieldAfterPolls = 16;  // empty completion-queue polls before yielding the CPU
constexpr int kSleepAfterPolls = 256; // ... and before sleeping 20 us between polls

uint64_t make_tag(uint32_t op, int src, int part, int chunk) {
  return (uint64_t(op & 0xffffffu) << 36) | (uint64_t(src & 0xffff) << 20) |
         (uint64_t(part & 0xff) << 12) | uint64_t(chunk & 0xfff);
}

}  // namespace

Communicator::Communicator(const Config& config) : config_(config) {
  config_.validate();
  if (config_.world_size == 1) return;
  bootstrap_ = std::make_unique<Bootstrap>(config_);
  fabric_ = std::make_unique<Fabric>(config_.provider, bootstrap_->local_ip(), config_.rank,
                                     config_.register_all_memory);
  const std::vector<std::vector<uint8_t>> addresses = bootstrap_->allgather(fabric_->address());
  fabric_->insert_peers(addresses);
  if (fabric_->provider_name() == "shm") {
    // A killed rank cannot remove its shared-memory region; the survivor that sees it die
    // does (the shm address is the region's name). Mappings stay valid for everyone.
    bootstrap_->on_peer_died = [addresses](int peer) {
      const std::vector<uint8_t>& a = addresses[size_t(peer)];
      shm_unlink(std::string(a.begin(), std::find(a.begin(), a.end(), uint8_t(0))).c_str());
    };
  }
  watchdog_ = std::make_unique<Watchdog>(*bootstrap_, config_.rank, config_.timeout_s);
  // Every endpoint exists once the address table is complete, so messages sent from here on
  // have a live destination. A barrier proves the fabric path works before returning.
  barrier();
}

Communicator::~Communicator() {
  if (!bootstrap_) return;
  // A clean close is collective: a closing barrier makes sure no rank tears its endpoint down
  // while a peer may still need a message from it (over tcp a completed send can still sit in
  // a socket buffer). Destroyed while an exception unwinds, or after a failed wait: no
  // barrier; tell the group we failed, so the others stop at once and name this rank.
  bool clean = !broken_ && std::uncaught_exceptions() == 0;
  if (clean) {
    try {
      barrier();
    } catch (const Error& e) {
      // A peer failed meanwhile: say so. Peers merely busy past the deadline (not closing
      // yet) are not failures: leave cleanly without them.
      clean = e.kind() == ErrorKind::Timeout;
    } catch (...) {
      clean = false;  // nothing may escape a destructor
    }
  }
  bootstrap_->leave(clean);
  for (auto& p : pending_) Fabric::deregister(p->mr);
  {
    // Closing the endpoint may touch a dead peer's shared memory: keep the watchdog on it.
    FabricCall call(watchdog_.get());
    fabric_.reset();
  }
  watchdog_.reset();
}

std::string Communicator::provider_name() const {
  return fabric_ ? fabric_->provider_name() : std::string("none");
}

std::vector<uint8_t> Communicator::address() const {
  return fabric_ ? fabric_->address() : std::vector<uint8_t>();
}

uint32_t Communicator::begin_op() { return next_op_++; }

void Communicator::post_send(int peer, const void* data, size_t bytes, uint32_t op, int part) {
  post(true, peer, const_cast<void*>(data), bytes, op, part, Fill::Exact);
}

void Communicator::post_recv(int peer, void* data, size_t bytes, uint32_t op, int part,
                             Fill fill) {
  post(false, peer, data, bytes, op, part, fill);
}

void Communicator::post(bool is_send, int peer, void* data, size_t bytes, uint32_t op,
                        int part, Fill fill) {
  MOERL_CHECK(!broken_, "rank ", rank(), ": communicator used after a peer failure");
  MOERL_CHECK(fabric_ != nullptr && peer >= 0 && peer < world_size() && peer != rank(),
              "rank ", rank(), ": bad peer ", peer, " for a message");
  MOERL_CHECK(part >= 0 && part < 256, "message part ", part, " out of range");
  const size_t chunk_bytes = std::min(kMaxChunk, fabric_->max_msg_size());
  const size_t num_chunks = bytes == 0 ? 1 : (bytes + chunk_bytes - 1) / chunk_bytes;
  MOERL_CHECK(num_chunks <= size_t(kMaxChunks), "message of ", bytes, " bytes is too large");
  const double deadline = now_s() + config_.timeout_s;
  for (size_t c = 0; c < num_chunks; ++c) {
    if (num_posted_ == pending_.size()) pending_.push_back(std::make_unique<Pending>());
    Pending& p = *pending_[num_posted_];
    p.peer = peer;
    p.is_send = is_send;
    p.done = false;
    char* chunk = static_cast<char*>(data) + c * chunk_bytes;
    const size_t len = std::min(chunk_bytes, bytes - std::min(bytes, c * chunk_bytes));
    p.bytes = len;
    p.exact = !is_send && fill == Fill::Exact;
    p.mr = fabric_->needs_local_mr() && len > 0 ? fabric_->register_memory(chunk, len, is_send)
                                                 : nullptr;
    const uint64_t tag = make_tag(op, is_send ? rank() : peer, part, int(c));
    ++num_posted_;
    for (;;) {
      FabricCall call(watchdog_.get());
      void* desc = Fabric::descriptor(p.mr);
      const int rc = is_send ? fabric_->try_send(peer, chunk, len, desc, tag, &p.context)
                             : fabric_->try_recv(peer, chunk, len, desc, tag, &p.context);
      if (rc == 0) break;
      // The provider's queues are full: reap completions to make room, then retry.
      progress("posting a message");
      if (watchdog_->has_failure()) fail(ErrorKind::PeerFailure, watchdog_->failure());
      if (now_s() > deadline) {
        fail(ErrorKind::Timeout, "rank " + std::to_string(rank()) +
                                     ": could not post a message to rank " + std::to_string(peer) +
                                     " before the deadline (queues full; rank " +
                                     std::to_string(peer) + " is dead or stalled)");
      }
    }
  }
}

// Before reporting a failure seen on the fabric (an error completion, a deadline), give the
// failure detector a moment: when a rank died, its socket closes at the same time, and the
// message should name the dead rank rather than a live one that merely waits for it.
void Communicator::fail(ErrorKind kind, const std::string& message) {
  broken_ = true;
  if (watchdog_) {
    const double until = now_s() + std::min(0.25, config_.timeout_s);
    while (!watchdog_->has_failure() && now_s() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (watchdog_->has_failure()) throw Error(ErrorKind::PeerFailure, watchdog_->failure());
  }
  throw Error(kind, message);
}

void Communicator::progress(const char* what) {
  Completion done[64];
  size_t n;
  {
    FabricCall call(watchdog_.get());
    n = fabric_->poll(done, 64);
  }
  for (size_t i = 0; i < n; ++i) {
    auto* p = reinterpret_cast<Pending*>(done[i].context);
    if (!done[i].ok) {
      std::ostringstream os;
      os << "rank " << rank() << ": " << what << ": message "
         << (p != nullptr && p->is_send ? "to" : "from") << " rank " << (p ? p->peer : -1)
         << " failed: " << done[i].error << "; rank " << (p ? p->peer : -1)
         << " is dead or unreachable";
      fail(ErrorKind::PeerFailure, os.str());
    }
    if (p->exact && done[i].bytes != p->bytes) {
      std::ostringstream os;
      os << __FILE__ << ":" << __LINE__ << ": rank " << rank() << ": " << what << ": rank "
         << p->peer << " sent a message of " << done[i].bytes << " bytes where " << p->bytes
         << " were expected (a corrupt message)";
      fail(ErrorKind::PeerFailure, os.str());
    }
    p->done = true;
    ++num_done_;
  }
}

void Communicator::wait_until_done(size_t begin, size_t end, const char* what,
                                   double timeout_s) {
  const double deadline = now_s() + timeout_s;
  int idle_polls = 0;
  for (;;) {
    while (begin < end && pending_[begin]->done) ++begin;  // completed prefix
    if (begin == end) return;
    const size_t before = num_done_;
    progress(what);
    if (num_done_ != before) {
      idle_polls = 0;
      continue;
    }
    if (watchdog_->has_failure()) fail(ErrorKind::PeerFailure, watchdog_->failure());
    if (now_s() > deadline) {
      broken_ = true;
      std::set<int> waiting_for;
      size_t outstanding = 0;
      for (size_t i = begin; i < end; ++i) {
        if (!pending_[i]->done) {
          waiting_for.insert(pending_[i]->peer);
          ++outstanding;
        }
      }
      std::ostringstream os;
      os << "rank " << rank() << ": " << what << " timed out after " << timeout_s
         << " s waiting for rank ";
      bool first = true;
      for (int r : waiting_for) os << (first ? "" : ", ") << r, first = false;
      os << " (" << outstanding << " message(s) outstanding); a rank is dead, stalled or "
         << "unreachable";
      fail(ErrorKind::Timeout, os.str());
    }
    // Back off while nothing completes: spin briefly (latency), then yield, then sleep, so a
    // waiting rank stops taking CPU from the ranks that do the copies when ranks outnumber
    // cores (several ranks per host, or a host shared with other work).
    ++idle_polls;
    if (idle_polls > kSleepAfterPolls) std::this_thread::sleep_for(std::chrono::microseconds(20));
    else if (idle_polls > kYieldAfterPolls) sched_yield();
  }
}

void Communicator::wait_range(size_t begin, size_t end, const char* what) {
  MOERL_CHECK(begin <= end && end <= num_posted(), "wait_range [", begin, ", ", end,
              ") outside the ", num_posted(), " posted messages");
  if (end > num_recycled_)  // recycled messages are done
    wait_until_done(std::max(begin, num_recycled_) - num_recycled_, end - num_recycled_, what,
                    config_.timeout_s);
  if (num_done_ == num_posted_) recycle();
}

void Communicator::wait_all(const char* what) {
  if (num_posted_ == 0) return;
  wait_until_done(0, num_posted_, what, config_.timeout_s);
  recycle();
}

void Communicator::recycle() {
  for (size_t i = 0; i < num_posted_; ++i) {
    Fabric::deregister(pending_[i]->mr);
    pending_[i]->mr = nullptr;
  }
  num_recycled_ += num_posted_;
  num_posted_ = 0;
  num_done_ = 0;
}

}  // namespace moerl::transport
