// Rank configuration: who this process is in the expert-parallel group and how it
// reaches its peers. Read from the rank env contract (docs/native-ep.md):
//   MOERL_RANK         this rank, 0 <= rank < world size        (default 0)
//   MOERL_WORLD_SIZE   number of ranks                          (default 1)
//   MOERL_COORDINATOR  host:port where rank 0 listens for the address exchange
//                      (required when the world size is above 1)
//   MOERL_FI_PROVIDER  libfabric provider: efa | tcp | shm      (default shm)
//   MOERL_TIMEOUT_S    deadline in seconds for every wait       (default 60)
// and one switch for testing:
//   MOERL_FI_REGISTER_ALL=1  register every message buffer, as efa requires, on any provider
//                            (runs the efa memory-registration path over shm or tcp)
#pragma once

#include <string>

namespace moerl::transport {

struct Config {
  int rank = 0;
  int world_size = 1;
  std::string coordinator;  // "host:port" of rank 0; empty when world_size == 1
  std::string provider = "shm";
  double timeout_s = 60.0;
  bool register_all_memory = false;

  // Reads the MOERL_* variables above; throws moerl::Error(BadInput) naming the
  // variable, its value and what is allowed when one is malformed.
  static Config from_env();
  // Same checks for a Config built by hand.
  void validate() const;
};

}  // namespace moerl::transport
