// Rank env contract parsing (see config.h). Every error names the variable, the value and
// what is allowed, and maps to exit code 2 (bad input, do not retry).
#include "transport/config.h"

#include <arpa/inet.h>  // inet_pton to check MOERL_BIND_ADDRESS

#include <cerrno>   // errno for strtol/strtod range errors
#include <cstdlib>  // std::getenv, std::strtol, std::strtod

#include "common/check.h"

namespace moerl::transport {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && v[0] != '\0') ? std::string(v) : std::string(fallback);
}

long parse_int(const char* name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  MOERL_CHECK_INPUT(errno == 0 && end != text.c_str() && *end == '\0', name, "='", text,
                    "' is not an integer");
  return v;
}

double parse_seconds(const char* name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  MOERL_CHECK_INPUT(errno == 0 && end != text.c_str() && *end == '\0', name, "='", text,
                    "' is not a number of seconds");
  return v;
}

}  // namespace

Config Config::from_env() {
  Config c;
  c.rank = int(parse_int("MOERL_RANK", env_or("MOERL_RANK", "0")));
  c.world_size = int(parse_int("MOERL_WORLD_SIZE", env_or("MOERL_WORLD_SIZE", "1")));
  c.coordinator = env_or("MOERL_COORDINATOR", "");
  c.coordinator_port_file = env_or("MOERL_COORDINATOR_PORT_FILE", "");
  c.provider = env_or("MOERL_FI_PROVIDER", "shm");
  const std::string timeout = env_or("MOERL_TIMEOUT_S", "60");
  c.timeout_s = parse_seconds("MOERL_TIMEOUT_S", timeout);
  c.startup_timeout_s =
      parse_seconds("MOERL_STARTUP_TIMEOUT_S", env_or("MOERL_STARTUP_TIMEOUT_S", timeout.c_str()));
  c.job_token = env_or("MOERL_JOB_TOKEN", "");
  c.bind_address = env_or("MOERL_BIND_ADDRESS", "");
  const std::string register_all = env_or("MOERL_FI_REGISTER_ALL", "0");
  MOERL_CHECK_INPUT(register_all == "0" || register_all == "1", "MOERL_FI_REGISTER_ALL='",
                    register_all, "' must be 0 or 1");
  c.register_all_memory = register_all == "1";
  c.validate();
  return c;
}

void Config::validate() const {
  MOERL_CHECK_INPUT(world_size >= 1 && world_size <= 65535, "MOERL_WORLD_SIZE=", world_size,
                    " must be between 1 and 65535");
  MOERL_CHECK_INPUT(rank >= 0 && rank < world_size, "MOERL_RANK=", rank,
                    " must be in [0, MOERL_WORLD_SIZE=", world_size, ")");
  MOERL_CHECK_INPUT(provider == "shm" || provider == "tcp" || provider == "efa",
                    "MOERL_FI_PROVIDER='", provider, "' must be one of efa, tcp, shm");
  MOERL_CHECK_INPUT(timeout_s > 0.0 && timeout_s <= 86400.0, "MOERL_TIMEOUT_S=", timeout_s,
                    " must be in (0, 86400]");
  // Up to a week: the longest a launcher lets a rank pend (unschedulableTimeoutSeconds).
  MOERL_CHECK_INPUT(startup_timeout_s > 0.0 && startup_timeout_s <= 604800.0,
                    "MOERL_STARTUP_TIMEOUT_S=", startup_timeout_s, " must be in (0, 604800]");
  MOERL_CHECK_INPUT(job_token.size() <= 4096, "MOERL_JOB_TOKEN is ", job_token.size(),
                    " bytes long; at most 4096 are allowed");
  in_addr parsed{};
  MOERL_CHECK_INPUT(bind_address.empty() || inet_pton(AF_INET, bind_address.c_str(), &parsed) == 1,
                    "MOERL_BIND_ADDRESS='", bind_address,
                    "' must be an IPv4 address such as 10.0.3.7");
  if (world_size > 1) {
    const auto colon = coordinator.rfind(':');
    const std::string port = colon == std::string::npos ? "" : coordinator.substr(colon + 1);
    char* end = nullptr;
    const long port_number = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
    MOERL_CHECK_INPUT(colon != std::string::npos && colon > 0 && end != nullptr && *end == '\0' &&
                          port_number >= 0 && port_number <= 65535,
                      "MOERL_COORDINATOR='", coordinator,
                      "' must be host:port (port 0-65535) of rank 0 when MOERL_WORLD_SIZE > 1");
    MOERL_CHECK_INPUT(port_number != 0 || !coordinator_port_file.empty(), "MOERL_COORDINATOR='",
                      coordinator, "' has port 0 (rank 0 takes a port the kernel picks) but "
                      "MOERL_COORDINATOR_PORT_FILE, where rank 0 publishes it, is not set");
  }
}

}  // namespace moerl::transport
