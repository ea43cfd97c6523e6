// Locked memory for the efa provider: the check a rank makes before it opens an efa endpoint.
//
// Why: registering host memory with an RDMA device pins it, and Linux counts pinned pages
// against RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK (ib_umem_get). The efa provider
// pins its send and receive packet buffers when the endpoint opens, and the communicator
// registers every message buffer while it is in flight (efa asks for FI_MR_LOCAL). A trainer
// pod runs non-root with no capabilities, so the limit applies, and it is the node's container
// runtime's: Kubernetes has no field for it. Too low a limit fails deep inside libfabric (an
// ENOMEM from fi_mr_reg, or "Failure to post internal receive buffers" and abort()); this
// check turns it into an error naming the limit and the docs section that says how to raise it
// (docs/operations.md, "EFA nodes: locked memory and huge pages").
// tcp and shm pin nothing: they are never checked.
#pragma once

#include <cstdint>  // uint64_t
#include <string>

namespace moerl::transport {

// The least a rank on efa accepts. One efa endpoint pins about 110 MiB of packet buffers (what
// Bottlerocket reserves huge pages for per endpoint, after AWS's EFA installer), and messages in
// flight come on top; 1 GiB covers both with room, and is far above what a container gets when
// nobody set the limit (the kernel's default: 64 KiB before Linux 5.16, 8 MiB since).
constexpr uint64_t kEfaMinLockedBytes = uint64_t(1) << 30;

// What this process may pin: its soft RLIMIT_MEMLOCK (the one the kernel checks) and whether
// CAP_IPC_LOCK is in its effective set (then no limit applies).
struct LockedMemory {
  bool is_unlimited = false;   // RLIM_INFINITY
  uint64_t soft_bytes = 0;     // meaningful when !is_unlimited
  uint64_t hard_bytes = 0;     // UINT64_MAX when the hard limit is unlimited
  bool has_ipc_lock = false;
};

// Reads this process's limit and capability.
LockedMemory read_locked_memory();

// Empty when a rank on `provider` may start with `memory`; otherwise what is wrong and how to
// fix it, for the error message.
std::string locked_memory_problem(const std::string& provider, const LockedMemory& memory);

// Throws moerl::Error(BadInput) naming the rank, the limit and what efa needs when
// locked_memory_problem() finds one for this process.
void check_locked_memory(const std::string& provider, int rank);

}  // namespace moerl::transport
