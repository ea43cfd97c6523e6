// Watchdog thread (see watchdog.h).
#include "transport/watchdog.h"

#include <chrono>   // sleep interval
#include <cstdio>   // std::fprintf to stderr before ending the process
#include <cstdlib>  // std::_Exit

#include "common/check.h"
#include "transport/bootstrap.h"
#include "transport/clock.h"

namespace moerl::transport {

Watchdog::Watchdog(Bootstrap& bootstrap, int rank, double timeout_s)
    : bootstrap_(bootstrap), rank_(rank), timeout_s_(timeout_s), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  stop_.store(true, std::memory_order_release);
  thread_.join();
}

std::string Watchdog::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void Watchdog::enter_fabric() {
  fabric_call_start_.store(now_s(), std::memory_order_release);
}

void Watchdog::run() {
  while (!stop_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double now = now_s();
    if (!has_failure()) {
      try {
        bootstrap_.check_peers();
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          failure_ = e.what();
        }
        failure_time_ = now;
        has_failure_.store(true, std::memory_order_release);
      }
    }
    const double call_start = fabric_call_start_.load(std::memory_order_acquire);
    if (call_start == 0.0) continue;
    // A call that began before a detected failure and has not returned a second later, or any
    // call that outlives the deadline, will not return: report and end the process.
    const bool stuck_after_failure = has_failure() && now - failure_time_ > 1.0 &&
                                     call_start < failure_time_ + 1.0;
    if (stuck_after_failure || now - call_start > timeout_s_ + 1.0) {
      const std::string why = has_failure() ? failure() : "no peer failure detected";
      std::fprintf(stderr,
                   "rank %d: stuck inside libfabric for %.1f s (%s); a peer probably died "
                   "holding a shared-memory lock. Exiting with code %d.\n",
                   rank_, now - call_start, why.c_str(), kExitStuck);
      std::fflush(stderr);
      std::_Exit(kExitStuck);
    }
  }
}

}  // namespace moerl::transport
