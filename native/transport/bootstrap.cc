// TCP rendezvous at rank 0 (see bootstrap.h). Wire format, all integers little-endian
// host order (every rank runs the same binary on the same architecture):
//   hello     peer -> rank 0   {magic, version, rank, world_size}
//   allgather peer -> rank 0   {length, bytes}; rank 0 -> peer: R x {length, bytes}
//   notices   either way       {kind, rank}: kBye (rank leaves cleanly), kFailed (rank hit an
//                              error and leaves), kDead (rank 0 saw the rank's socket close)
#include "transport/bootstrap.h"

#include <arpa/inet.h>   // inet_ntop, htons
#include <fcntl.h>       // fcntl, O_NONBLOCK
#include <netdb.h>       // getaddrinfo
#include <netinet/in.h>  // sockaddr_in
#include <netinet/tcp.h> // TCP_NODELAY
#include <poll.h>        // poll
#include <sys/socket.h>  // socket, bind, listen, accept, connect
#include <unistd.h>      // close, read, write

#include <algorithm>  // std::min
#include <cerrno>     // errno
#include <cstring>    // std::strerror, std::memcpy
#include <sstream>    // std::ostringstream for the list of missing ranks
#include <thread>     // std::this_thread::sleep_for between connect attempts

#include "common/check.h"
#include "transport/clock.h"

namespace moerl::transport {
namespace {

constexpr uint32_t kMagic = 0x4d4f4550;  // "MOEP"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxBlob = 1u << 20;  // fabric addresses are tens of bytes

enum NoticeKind : uint32_t { kBye = 1, kFailed = 2, kDead = 3 };
struct Notice {
  uint32_t kind;
  int32_t rank;
};

struct Hello {
  uint32_t magic, version;
  int32_t rank, world_size;
};

int remaining_ms(double deadline) {
  const double left = deadline - now_s();
  return left <= 0 ? 0 : int(std::min(left * 1000.0 + 1.0, 1e9));
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Moves exactly n bytes, waiting at most until the deadline; `who` names the peer.
void transfer(bool is_write, int fd, void* buf, size_t n, double deadline, int self, int who,
              double timeout_s) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t k = is_write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= size_t(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
      MOERL_FAIL(PeerFailure, "rank ", self, ": rank ", who, " died during start-up (its "
                 "bootstrap connection ", k == 0 ? "closed" : std::strerror(errno), ")");
    }
    pollfd pfd{fd, short(is_write ? POLLOUT : POLLIN), 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0 || ::poll(&pfd, 1, ms) == 0) {
      MOERL_FAIL(Timeout, "rank ", self, ": timed out after ", timeout_s,
                 " s in the bootstrap waiting for rank ", who, " (dead, stalled or unreachable)");
    }
  }
}

void split_host_port(const std::string& hp, std::string& host, std::string& port) {
  const auto colon = hp.rfind(':');
  host = hp.substr(0, colon);
  port = hp.substr(colon + 1);
}

std::string sock_ip(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  MOERL_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0, "getsockname: ",
              std::strerror(errno));
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace

Bootstrap::Bootstrap(const Config& config)
    : config_(config), deadline_(now_s() + config.timeout_s) {
  const int self = config.rank, world = config.world_size;
  std::string host, port;
  split_host_port(config.coordinator, host, port);
  if (self == 0) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    MOERL_CHECK(listen_fd_ >= 0, "socket: ", std::strerror(errno));
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(uint16_t(std::stoi(port)));
    // Retryable (not bad input): the port may be held by a group that is just going away.
    MOERL_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0,
                "rank 0 cannot listen on MOERL_COORDINATOR port ", port, ": ",
                std::strerror(errno), " (is another group using it?)");
    MOERL_CHECK(::listen(listen_fd_, world) == 0, "listen: ", std::strerror(errno));
    set_nonblocking(listen_fd_);
    peer_fds_.assign(size_t(world), -1);
    for (int connected = 1; connected < world;) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      const int ms = remaining_ms(deadline_);
      if (ms == 0 || ::poll(&pfd, 1, ms) == 0) {
        std::ostringstream missing;
        for (int r = 1; r < world; ++r)
          if (peer_fds_[size_t(r)] < 0) missing << (missing.tellp() > 0 ? ", " : "") << r;
        MOERL_FAIL(Timeout, "rank 0: timed out after ", config.timeout_s,
                   " s waiting for rank(s) ", missing.str(), " to connect to the coordinator ",
                   config.coordinator, " (dead, not started or cannot reach it)");
      }
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      set_nonblocking(fd);
      Hello hello{};
      transfer(false, fd, &hello, sizeof(hello), deadline_, 0, -1, config.timeout_s);
      if (hello.magic != kMagic || hello.version != kVersion) {
        ::close(fd);  // not one of ours (a port scanner, an old binary): ignore it
        continue;
      }
      MOERL_CHECK_INPUT(hello.world_size == world, "rank ", hello.rank, " says MOERL_WORLD_SIZE=",
                        hello.world_size, " but rank 0 has ", world);
      MOERL_CHECK_INPUT(hello.rank > 0 && hello.rank < world && peer_fds_[size_t(hello.rank)] < 0,
                        "two processes claim MOERL_RANK=", hello.rank, " (or it is out of range)");
      peer_fds_[size_t(hello.rank)] = fd;
      if (local_ip_.empty()) local_ip_ = sock_ip(fd);
      ++connected;
    }
    return;
  }

  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  int fd = -1;
  while (fd < 0) {
    if (now_s() >= deadline_) {
      MOERL_FAIL(Timeout, "rank ", self, ": could not reach the coordinator ", config.coordinator,
                 " (rank 0) within ", config.timeout_s, " s: ", last_error);
    }
    const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      last_error = std::string("cannot resolve ") + host + ": " + gai_strerror(gai);
    } else {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      set_nonblocking(fd);
      int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        if (::poll(&pfd, 1, std::min(remaining_ms(deadline_), 1000)) == 1) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc != 0) {
        last_error = std::strerror(errno);
        ::close(fd);
        fd = -1;
      }
      freeaddrinfo(res);
    }
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  peer_fds_.assign(1, fd);
  local_ip_ = sock_ip(fd);
  Hello hello{kMagic, kVersion, self, world};
  transfer(true, fd, &hello, sizeof(hello), deadline_, self, 0, config.timeout_s);
}

void Bootstrap::check_peers() {
  const int self = config_.rank;
  departed_.resize(peer_fds_.size(), false);
  partial_.resize(peer_fds_.size());
  for (size_t i = 0; i < peer_fds_.size(); ++i) {
    const int fd = peer_fds_[i];
    if (fd < 0 || departed_[i]) continue;
    const int peer = self == 0 ? int(i) : 0;
    for (;;) {
      char buf[64];
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      if (n <= 0) {
        // The kernel closed the socket of a process that exited without saying goodbye.
        if (self == 0) {
          const Notice dead{kDead, peer};
          for (size_t j = 1; j < peer_fds_.size(); ++j)
            if (j != i && peer_fds_[j] >= 0 && !departed_[j])
              ::send(peer_fds_[j], &dead, sizeof(dead), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        departed_[i] = true;
        if (on_peer_died) on_peer_died(peer);
        MOERL_FAIL(PeerFailure, "rank ", self, ": rank ", peer,
                   " died (its connection to the coordinator closed without a goodbye)");
      }
      partial_[i].append(buf, size_t(n));
      while (partial_[i].size() >= sizeof(Notice)) {
        Notice notice;
        std::memcpy(&notice, partial_[i].data(), sizeof(notice));
        partial_[i].erase(0, sizeof(notice));
        if (notice.kind == kBye) {
          departed_[i] = true;
          continue;
        }
        if (self == 0) {  // relay so every rank names the same culprit
          for (size_t j = 1; j < peer_fds_.size(); ++j)
            if (j != i && peer_fds_[j] >= 0 && !departed_[j])
              ::send(peer_fds_[j], &notice, sizeof(notice), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        departed_[i] = true;
        if (notice.kind == kDead) {
          MOERL_FAIL(PeerFailure, "rank ", self, ": rank ", notice.rank,
                     " died (reported by the coordinator, rank 0)");
        }
        MOERL_FAIL(PeerFailure, "rank ", self, ": rank ", notice.rank,
                   " failed and left the group (see that rank's log for the cause)");
      }
      if (departed_[i]) break;
    }
  }
}

void Bootstrap::leave(bool clean) noexcept {
  // Touches only the sockets (fixed after construction), so the watchdog thread may keep
  // running check_peers meanwhile; a send to a departed peer just fails (no SIGPIPE).
  const Notice notice{clean ? kBye : kFailed, config_.rank};
  for (const int fd : peer_fds_)
    if (fd >= 0) ::send(fd, &notice, sizeof(notice), MSG_NOSIGNAL | MSG_DONTWAIT);
}

Bootstrap::~Bootstrap() {
  for (int fd : peer_fds_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::vector<std::vector<uint8_t>> Bootstrap::allgather(const std::vector<uint8_t>& mine) {
  const int self = config_.rank, world = config_.world_size;
  const double t = config_.timeout_s;
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(world));
  all[size_t(self)] = mine;
  if (self == 0) {
    for (int r = 1; r < world; ++r) {
      uint32_t len = 0;
      transfer(false, peer_fds_[size_t(r)], &len, 4, deadline_, 0, r, t);
      MOERL_CHECK(len <= kMaxBlob, "rank ", r, " sent a ", len, "-byte bootstrap blob");
      all[size_t(r)].resize(len);
      transfer(false, peer_fds_[size_t(r)], all[size_t(r)].data(), len, deadline_, 0, r, t);
    }
    for (int r = 1; r < world; ++r) {
      for (auto& blob : all) {
        uint32_t len = uint32_t(blob.size());
        transfer(true, peer_fds_[size_t(r)], &len, 4, deadline_, 0, r, t);
        transfer(true, peer_fds_[size_t(r)], blob.data(), len, deadline_, 0, r, t);
      }
    }
    return all;
  }
  const int fd = peer_fds_[0];
  uint32_t len = uint32_t(mine.size());
  transfer(true, fd, &len, 4, deadline_, self, 0, t);
  transfer(true, fd, const_cast<uint8_t*>(mine.data()), len, deadline_, self, 0, t);
  for (int r = 0; r < world; ++r) {
    transfer(false, fd, &len, 4, deadline_, self, 0, t);
    MOERL_CHECK(len <= kMaxBlob, "rank 0 relayed a ", len, "-byte bootstrap blob");
    all[size_t(r)].resize(len);
    transfer(false, fd, all[size_t(r)].data(), len, deadline_, self, 0, t);
  }
  return all;
}

}  // namespace moerl::transport
