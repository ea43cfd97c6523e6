// The coordinator of ranks that a process starts itself on this host (the dev tools, the
// native tests): rank 0 binds 127.0.0.1:0 and publishes the port the kernel gave it in a file
// of a fresh 0700 directory (MOERL_COORDINATOR_PORT_FILE, docs/native-ep.md), so no port is
// chosen ahead, released, and left for another local user to bind first. One per group.
#pragma once

#include <string>
#include <vector>

namespace moerl::transport {

class LocalCoordinator {
 public:
  LocalCoordinator();   // makes the directory under $TMPDIR (or /tmp)
  ~LocalCoordinator();  // removes it, with the port file
  LocalCoordinator(const LocalCoordinator&) = delete;
  LocalCoordinator& operator=(const LocalCoordinator&) = delete;

  // "MOERL_COORDINATOR=127.0.0.1:0" and "MOERL_COORDINATOR_PORT_FILE=<dir>/coordinator.port",
  // for every rank's environment.
  std::vector<std::string> env() const;
  // A name no other group of this process or host has (the directory's), e.g. for a job token.
  const std::string& id() const { return id_; }

 private:
  std::string dir_, id_;
};

}  // namespace moerl::transport
