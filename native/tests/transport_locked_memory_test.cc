// The efa locked-memory check (transport/locked_memory.h): which limits a rank on efa refuses,
// and that an efa endpoint refuses a low limit before libfabric is asked for anything. No EFA
// device is needed: the check runs first, so a process whose RLIMIT_MEMLOCK was lowered (and
// whose CAP_IPC_LOCK was dropped, when the tests run as root) fails with the check's message
// rather than libfabric's "no RDM endpoint".
#include <linux/capability.h>  // CAP_IPC_LOCK, the capget/capset structs
#include <sys/resource.h>      // setrlimit, RLIMIT_MEMLOCK
#include <sys/syscall.h>       // SYS_capget, SYS_capset
#include <unistd.h>            // syscall

#include <cstdlib>   // std::exit
#include <iostream>  // std::cerr in the child of the death test
#include <string>

#include <gtest/gtest.h>

#include "common/check.h"
#include "transport/fabric.h"
#include "transport/locked_memory.h"

namespace moerl::transport {
namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;

LockedMemory limited(uint64_t bytes) {
  LockedMemory m;
  m.soft_bytes = bytes;
  m.hard_bytes = bytes;
  return m;
}

TEST(TransportLockedMemory, EfaRefusesTheDefaultsAContainerGets) {
  // The kernel's default since Linux 5.16, and the one before it.
  const std::string eight_mib = locked_memory_problem("efa", limited(8 * kMiB));
  EXPECT_NE(eight_mib.find("RLIMIT_MEMLOCK (max locked memory) is 8 MiB (hard limit 8 MiB)"),
            std::string::npos)
      << eight_mib;
  EXPECT_NE(eight_mib.find("needs at least 1 GiB"), std::string::npos) << eight_mib;
  EXPECT_NE(eight_mib.find("docs/operations.md"), std::string::npos) << eight_mib;
  const std::string sixty_four_kib = locked_memory_problem("efa", limited(64 * 1024));
  EXPECT_NE(sixty_four_kib.find("is 64 KiB"), std::string::npos) << sixty_four_kib;
  LockedMemory soft_only = limited(8 * kMiB);
  soft_only.hard_bytes = UINT64_MAX;
  EXPECT_NE(locked_memory_problem("efa", soft_only).find("8 MiB (hard limit unlimited)"),
            std::string::npos);
  // Just under the floor is still too little.
  EXPECT_FALSE(locked_memory_problem("efa", limited(kEfaMinLockedBytes - 4096)).empty());
}

TEST(TransportLockedMemory, EfaAcceptsEnoughUnlimitedOrCapIpcLock) {
  EXPECT_EQ(locked_memory_problem("efa", limited(kEfaMinLockedBytes)), "");
  EXPECT_EQ(locked_memory_problem("efa", limited(uint64_t(1) << 50)), "");  // cluster.yaml's
  LockedMemory unlimited;
  unlimited.is_unlimited = true;
  EXPECT_EQ(locked_memory_problem("efa", unlimited), "");
  LockedMemory privileged = limited(64 * 1024);
  privileged.has_ipc_lock = true;  // the kernel ignores the limit then
  EXPECT_EQ(locked_memory_problem("efa", privileged), "");
}

TEST(TransportLockedMemory, TcpAndShmPinNothing) {
  EXPECT_EQ(locked_memory_problem("tcp", limited(0)), "");
  EXPECT_EQ(locked_memory_problem("shm", limited(0)), "");
}

// In the child of a death test only: the process may no longer lift the limit.
void lower_locked_memory_to(uint64_t bytes) {
  const rlimit limit{rlim_t(bytes), rlim_t(bytes)};
  if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) std::exit(10);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) std::exit(11);
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  if (syscall(SYS_capset, &header, data) != 0) std::exit(12);
}

TEST(TransportLockedMemory, EfaEndpointRefusesALowLimitBeforeLibfabric) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        lower_locked_memory_to(8 * kMiB);
        const LockedMemory seen = read_locked_memory();
        if (seen.is_unlimited || seen.soft_bytes != 8 * kMiB || seen.has_ipc_lock) std::exit(13);
        try {
          Fabric fabric("efa", "", 3, false);
          std::exit(0);
        } catch (const moerl::Error& e) {
          std::cerr << e.what() << std::endl;
          std::exit(e.kind() == ErrorKind::BadInput ? 2 : 1);
        }
      },
      ::testing::ExitedWithCode(2), "rank 3: RLIMIT_MEMLOCK \\(max locked memory\\) is 8 MiB");
}

}  // namespace
}  // namespace moerl::transport
