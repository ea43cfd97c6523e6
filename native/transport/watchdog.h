// Watchdog: a thread that runs the failure detector (Bootstrap::check_peers) every 10 ms and
// guards against hangs inside libfabric.
//
// Why a thread: a rank killed while it holds a lock inside the shm provider's shared-memory
// queues leaves that lock taken forever, and a peer's next fi_tsend spins on it without
// returning. No deadline check on the calling thread can fire then. The watchdog sees the
// call outlive the deadline (or a detected peer death) and ends the process with a message
// naming the dead rank and exit code kExitStuck: the one place the library ends a process,
// because a thread spinning in a third-party lock cannot be unwound.
#pragma once

#include <atomic>   // std::atomic for the flags shared with the watchdog thread
#include <mutex>    // std::mutex guarding the failure message
#include <string>
#include <thread>   // std::thread

namespace moerl::transport {

class Bootstrap;

class Watchdog {
 public:
  static constexpr int kExitStuck = 3;  // retryable under the rank contract

  Watchdog(Bootstrap& bootstrap, int rank, double timeout_s);
  ~Watchdog();  // stops and joins the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Whether a peer failure was detected, and its message (names the rank). Thread-safe.
  bool has_failure() const { return has_failure_.load(std::memory_order_acquire); }
  std::string failure() const;

  // Brackets every call into libfabric made by the communicator's thread.
  void enter_fabric();
  void leave_fabric() { fabric_call_start_.store(0.0, std::memory_order_release); }

 private:
  void run();

  Bootstrap& bootstrap_;
  int rank_;
  double timeout_s_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> has_failure_{false};
  std::atomic<double> fabric_call_start_{0.0};  // monotonic seconds, 0 when not in a call
  double failure_time_ = 0;                     // watchdog thread only
  mutable std::mutex mutex_;
  std::string failure_;
  std::thread thread_;
};

// RAII bracket for one libfabric call (no-op without a watchdog).
class FabricCall {
 public:
  explicit FabricCall(Watchdog* w) : w_(w) {
    if (w_ != nullptr) w_->enter_fabric();
  }
  ~FabricCall() {
    if (w_ != nullptr) w_->leave_fabric();
  }
  FabricCall(const FabricCall&) = delete;
  FabricCall& operator=(const FabricCall&) = delete;

 private:
  Watchdog* w_;
};

}  // namespace moerl::transport
