// Rank configuration: who this process is in the expert-parallel group and how it
// reaches its peers. Read from the rank env contract (docs/native-ep.md):
//   MOERL_RANK         this rank, 0 <= rank < world size        (default 0)
//   MOERL_WORLD_SIZE   number of ranks                          (default 1)
//   MOERL_COORDINATOR  host:port where rank 0 listens for the address exchange
//                      (required when the world size is above 1); port 0: rank 0 listens
//                      on a port the kernel picks and publishes it in the port file
//   MOERL_COORDINATOR_PORT_FILE  required with port 0: rank 0 writes the port it got there
//                      (atomically, mode 0600), the other ranks read it (local launchers:
//                      a file in the job's own directory; no port is chosen and released
//                      for another local user to take first)
//   MOERL_FI_PROVIDER  libfabric provider: efa | tcp | shm      (default shm)
//   MOERL_TIMEOUT_S    deadline in seconds for each exchange once the group has formed
//                      (default 60)
//   MOERL_STARTUP_TIMEOUT_S  deadline in seconds for forming the group: every rank started,
//                      connected to rank 0 and its address known (default MOERL_TIMEOUT_S;
//                      the launchers set it to their pending timeout: a slow start is not
//                      a failure)
//   MOERL_JOB_TOKEN    the job's secret: rank 0 admits a peer only once it has proved it
//                      knows the token, and a peer trusts rank 0 the same way (default
//                      empty: no authentication, for groups started by hand)
//   MOERL_BIND_ADDRESS IPv4 address rank 0 listens on (pod: its pod IP); default the
//                      coordinator's host, so locally 127.0.0.1 and never every interface
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
  std::string coordinator_port_file;  // where rank 0 publishes its port when the port is 0
  std::string provider = "shm";
  double timeout_s = 60.0;          // each exchange once the group has formed
  double startup_timeout_s = 60.0;  // forming the group (Bootstrap)
  std::string job_token;            // secret shared by the job's ranks; empty: none
  std::string bind_address;         // rank 0's listening IPv4 address; empty: coordinator host
  bool register_all_memory = false;

  // Reads the MOERL_* variables above; throws moerl::Error(BadInput) naming the
  // variable, its value and what is allowed when one is malformed.
  static Config from_env();
  // Same checks for a Config built by hand.
  void validate() const;
};

}  // namespace moerl::transport
