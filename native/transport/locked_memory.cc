// Locked-memory check for the efa provider (see locked_memory.h).
#include "transport/locked_memory.h"

#include <linux/capability.h>  // CAP_IPC_LOCK, the capget header and data structs
#include <sys/resource.h>      // getrlimit, RLIMIT_MEMLOCK, RLIM_INFINITY
#include <sys/syscall.h>       // SYS_capget: glibc has no wrapper without libcap
#include <unistd.h>            // syscall

#include <cerrno>    // errno
#include <cstring>   // strerror
#include <sstream>   // std::ostringstream

#include "common/check.h"

namespace moerl::transport {
namespace {

// 8388608 -> "8 MiB", 65536 -> "64 KiB"; sizes that are no whole unit stay in bytes.
std::string describe_bytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (unit < 5 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + " " + units[unit];
}

bool has_effective_ipc_lock() {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;  // this process
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;  // unknown: the limit decides
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

}  // namespace

LockedMemory read_locked_memory() {
  rlimit limit{};
  MOERL_CHECK(getrlimit(RLIMIT_MEMLOCK, &limit) == 0, "getrlimit(RLIMIT_MEMLOCK) failed: ",
              std::strerror(errno));
  LockedMemory memory;
  memory.is_unlimited = limit.rlim_cur == RLIM_INFINITY;
  memory.soft_bytes = memory.is_unlimited ? UINT64_MAX : uint64_t(limit.rlim_cur);
  memory.hard_bytes = limit.rlim_max == RLIM_INFINITY ? UINT64_MAX : uint64_t(limit.rlim_max);
  memory.has_ipc_lock = has_effective_ipc_lock();
  return memory;
}

std::string locked_memory_problem(const std::string& provider, const LockedMemory& memory) {
  if (provider != "efa") return {};
  if (memory.is_unlimited || memory.has_ipc_lock || memory.soft_bytes >= kEfaMinLockedBytes)
    return {};
  std::ostringstream os;
  os << "RLIMIT_MEMLOCK (max locked memory) is " << describe_bytes(memory.soft_bytes)
     << " (hard limit "
     << (memory.hard_bytes == UINT64_MAX ? std::string("unlimited")
                                         : describe_bytes(memory.hard_bytes))
     << "); the efa provider needs at least " << describe_bytes(kEfaMinLockedBytes)
     << ": it pins its packet buffers (about 110 MiB an endpoint) and every message buffer in "
        "flight, and without CAP_IPC_LOCK (a non-root pod never has it) the kernel refuses "
        "pinning past this limit. A container gets the limit from the node's container runtime, "
        "not from the pod: raise it there (on EKS AL2023 nodes, NodeConfig "
        "containerd.baseRuntimeSpec as in k8s/overlays/eks/cluster.yaml) and check with "
        "`grep 'locked memory' /proc/self/limits` in a pod on the node; see docs/operations.md, "
        "\"EFA nodes: locked memory and huge pages\"";
  return os.str();
}

void check_locked_memory(const std::string& provider, int rank) {
  if (provider != "efa") return;  // read nothing for providers that pin nothing
  const std::string problem = locked_memory_problem(provider, read_locked_memory());
  MOERL_CHECK_INPUT(problem.empty(), "rank ", rank, ": ", problem);
}

}  // namespace moerl::transport
