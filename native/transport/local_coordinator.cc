// See local_coordinator.h.
#include "transport/local_coordinator.h"

#include <stdlib.h>  // mkdtemp, getenv

#include <cerrno>
#include <cstring>     // std::strerror
#include <filesystem>  // remove_all

#include "common/check.h"

namespace moerl::transport {

LocalCoordinator::LocalCoordinator() {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                     "/moerl-coordinator-XXXXXX";
  MOERL_CHECK(::mkdtemp(path.data()) != nullptr, "cannot make a directory for the coordinator's "
              "port file (", path, "): ", std::strerror(errno));  // mkdtemp makes it 0700
  dir_ = path;
  id_ = path.substr(path.rfind('-') + 1);
}

LocalCoordinator::~LocalCoordinator() {
  std::error_code ignored;  // nothing to do about a directory that cannot be removed
  std::filesystem::remove_all(dir_, ignored);
}

std::vector<std::string> LocalCoordinator::env() const {
  return {"MOERL_COORDINATOR=127.0.0.1:0", "MOERL_COORDINATOR_PORT_FILE=" + dir_ + "/coordinator.port"};
}

}  // namespace moerl::transport
