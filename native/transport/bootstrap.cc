// TCP rendezvous at rank 0 (see bootstrap.h). Wire format, all integers little-endian
// host order (every rank runs the same binary on the same architecture):
//   challenge rank 0 -> peer   {magic "MOEC", version, nonce0[16]}, as soon as it connects
//   hello     peer -> rank 0   {magic "MOEP", version, rank, world_size, nonce1[16], mac[32]}
//                              mac = HMAC-SHA256(token, "hello" nonce0 rank world_size nonce1)
//   welcome   rank 0 -> peer   {mac[32]} = HMAC-SHA256(token, "welcome" nonce1 rank world_size
//                              nonce0): rank 0 knows the token too
//   allgather peer -> rank 0   {length, bytes}; rank 0 -> peer: R x {length, bytes}
//   notices   either way       {kind, rank}: kBye (rank leaves cleanly), kFailed (rank hit an
//                              error and leaves), kDead (rank 0 saw the rank's socket close)
// Fresh nonces on both sides make a recorded handshake worthless to replay. The token itself
// never crosses the wire; what follows the handshake is not encrypted (a fabric address).
#include "transport/bootstrap.h"

#include <arpa/inet.h>    // inet_ntop, inet_pton, htons
#include <fcntl.h>        // fcntl, O_NONBLOCK, open for the port file
#include <netdb.h>        // getaddrinfo
#include <netinet/in.h>   // sockaddr_in
#include <netinet/tcp.h>  // TCP_NODELAY
#include <openssl/crypto.h>  // CRYPTO_memcmp: constant-time comparison of MACs
#include <openssl/evp.h>     // EVP_sha256
#include <openssl/hmac.h>    // HMAC
#include <poll.h>         // poll
#include <sys/random.h>   // getrandom for the nonces
#include <sys/socket.h>   // socket, bind, listen, accept, connect
#include <unistd.h>       // close, read, write

#include <algorithm>  // std::min
#include <array>      // std::array for a MAC
#include <cerrno>     // errno
#include <cstdio>     // std::rename for the port file
#include <cstring>    // std::strerror, std::memcpy
#include <fstream>    // std::ifstream for the port file
#include <sstream>    // std::ostringstream for the list of missing ranks
#include <thread>     // std::this_thread::sleep_for between connect attempts

#include "common/check.h"
#include "transport/clock.h"

namespace moerl::transport {
namespace {

constexpr uint32_t kChallengeMagic = 0x4d4f4543;  // "MOEC"
constexpr uint32_t kMagic = 0x4d4f4550;           // "MOEP"
constexpr uint32_t kVersion = 2;
constexpr uint32_t kMaxBlob = 1u << 20;  // fabric addresses are tens of bytes
// A connection must finish its handshake this soon after it was accepted (a rank answers at
// once; only a stranger is slower), and at most this many handshakes are open at a time (the
// oldest gives way): neither a silent connection nor a flood of them can stall rank 0.
constexpr double kHandshakeTimeoutS = 10.0;
constexpr size_t kMaxHandshakes = 64;

enum NoticeKind : uint32_t { kBye = 1, kFailed = 2, kDead = 3 };
struct Notice {
  uint32_t kind;
  int32_t rank;
};

constexpr size_t kNonceBytes = 16, kMacBytes = 32;
using Mac = std::array<uint8_t, kMacBytes>;

struct Challenge {
  uint32_t magic, version;
  uint8_t nonce[kNonceBytes];
};

struct Hello {
  uint32_t magic, version;
  int32_t rank, world_size;
  uint8_t nonce[kNonceBytes];
  uint8_t mac[kMacBytes];
};

struct Welcome {
  uint8_t mac[kMacBytes];
};

void fill_random(uint8_t* out, size_t n) {
  while (n > 0) {
    const ssize_t k = ::getrandom(out, n, 0);
    if (k < 0 && errno == EINTR) continue;
    MOERL_CHECK(k > 0, "getrandom: ", std::strerror(errno));
    out += k;
    n -= size_t(k);
  }
}

// HMAC-SHA256 under the job token of: label, nonce_a, rank, world, nonce_b.
Mac job_mac(const std::string& token, const char* label, const uint8_t* nonce_a, int32_t rank,
            int32_t world, const uint8_t* nonce_b) {
  std::string message(label, std::strlen(label) + 1);  // the NUL ends the label
  message.append(reinterpret_cast<const char*>(nonce_a), kNonceBytes);
  message.append(reinterpret_cast<const char*>(&rank), sizeof(rank));
  message.append(reinterpret_cast<const char*>(&world), sizeof(world));
  message.append(reinterpret_cast<const char*>(nonce_b), kNonceBytes);
  Mac mac{};
  unsigned int len = 0;
  MOERL_CHECK(HMAC(EVP_sha256(), token.data(), int(token.size()),
                   reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                   mac.data(), &len) != nullptr && len == kMacBytes,
              "HMAC-SHA256 failed");
  return mac;
}

bool same_mac(const Mac& expected, const uint8_t* got) {
  return CRYPTO_memcmp(expected.data(), got, kMacBytes) == 0;
}

int remaining_ms(double deadline) {
  const double left = deadline - now_s();
  return left <= 0 ? 0 : int(std::min(left * 1000.0 + 1.0, 1e9));
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

enum class Moved { Done, Closed, TimedOut };

// Moves exactly n bytes unless the connection closes or fails (Closed, errno kept in *err:
// 0 for an orderly close) or `until` passes first (TimedOut).
Moved move_within(bool is_write, int fd, void* buf, size_t n, double until, int* err) {
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
      *err = k == 0 ? 0 : errno;
      return Moved::Closed;
    }
    pollfd pfd{fd, short(is_write ? POLLOUT : POLLIN), 0};
    const int ms = remaining_ms(until);
    if (ms == 0 || ::poll(&pfd, 1, ms) == 0) return Moved::TimedOut;
  }
  return Moved::Done;
}

// Moves exactly n bytes to or from an admitted rank before the deadline; `who` names it.
void transfer(bool is_write, int fd, void* buf, size_t n, double deadline, int self, int who,
              double timeout_s) {
  int err = 0;
  const Moved moved = move_within(is_write, fd, buf, n, deadline, &err);
  if (moved == Moved::Closed) {
    MOERL_FAIL(PeerFailure, "rank ", self, ": rank ", who, " died during start-up (its "
               "bootstrap connection ", err == 0 ? "closed" : std::strerror(err), ")");
  }
  if (moved == Moved::TimedOut) {
    MOERL_FAIL(Timeout, "rank ", self, ": timed out after ", timeout_s,
               " s in the bootstrap waiting for rank ", who, " (dead, stalled or unreachable)");
  }
}

void split_host_port(const std::string& hp, std::string& host, std::string& port) {
  const auto colon = hp.rfind(':');
  host = hp.substr(0, colon);
  port = hp.substr(colon + 1);
}

// True once the other end of a connected socket has closed or reset it, even while bytes it
// sent are still unread (an admitted rank sends its allgather blob at once).
bool hung_up(int fd) {
  pollfd pfd{fd, POLLRDHUP, 0};
  return ::poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// Both ends of a connected socket; false once it has been reset (rank 0 went away meanwhile).
bool socket_ends(int fd, sockaddr_in& mine, sockaddr_in& theirs) {
  socklen_t len = sizeof(mine);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len) != 0) return false;
  len = sizeof(theirs);
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &len) == 0;
}

std::string ip_text(const in_addr& addr) {
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &addr, text, sizeof(text));
  return text;
}

// The IPv4 address rank 0 listens on: MOERL_BIND_ADDRESS, else the coordinator's host. False
// (and why) while that name does not resolve: a pod's own DNS name appears only once the
// headless Service has published its address, a moment after the pod started.
bool listen_address(const Config& config, const std::string& host, in_addr& addr,
                    std::string& why) {
  const std::string& text = config.bind_address.empty() ? host : config.bind_address;
  if (inet_pton(AF_INET, text.c_str(), &addr) == 1) return true;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int gai = ::getaddrinfo(text.c_str(), nullptr, &hints, &res);
  if (gai != 0) {
    why = std::string("cannot resolve ") + text + ": " + gai_strerror(gai);
    return false;
  }
  addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return true;
}

// One connection attempt to the coordinator; -1 (and why in last_error) when it fails.
int connect_once(const std::string& host, const std::string& port, double deadline,
                 std::string& last_error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    last_error = std::string("cannot resolve ") + host + ": " + gai_strerror(gai);
    return -1;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  MOERL_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  set_nonblocking(fd);
  int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, std::min(remaining_ms(deadline), 1000)) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    } else {
      errno = ETIMEDOUT;
    }
  }
  freeaddrinfo(res);
  if (rc != 0) {
    last_error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Rank 0 publishes the port the kernel gave it: "<port>\n" in a 0600 file beside `path`,
// renamed over it, so a reader sees the whole port or no file.
void publish_port(const std::string& path, int port) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  MOERL_CHECK(fd >= 0, "rank 0 cannot write MOERL_COORDINATOR_PORT_FILE ", path, ": ", tmp, ": ",
              std::strerror(errno));
  const std::string text = std::to_string(port) + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  const int err = errno;
  ::close(fd);
  MOERL_CHECK(written, "rank 0 cannot write ", tmp, ": ", std::strerror(err));
  MOERL_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "rank 0 cannot rename ", tmp,
              " to MOERL_COORDINATOR_PORT_FILE ", path, ": ", std::strerror(errno));
}

// The port rank 0 published in `path`; false (and why) while there is none yet.
bool published_port(const std::string& path, std::string& port, std::string& why) {
  std::ifstream in(path);
  int number = 0;
  if (in >> number && number >= 1 && number <= 65535) {
    port = std::to_string(number);
    return true;
  }
  why = in.is_open() ? "MOERL_COORDINATOR_PORT_FILE " + path + " holds no port"
                     : "rank 0 has not published its port in MOERL_COORDINATOR_PORT_FILE " +
                           path + " yet";
  return false;
}

// A handshake rank 0 has begun with a connection it accepted: admitted or dropped.
struct Handshake {
  int fd = -1;
  double until = 0;  // dropped when not done by then
  Challenge challenge{};
  Hello hello{};
  size_t got = 0;  // bytes of the hello received so far
};

}  // namespace

Bootstrap::Bootstrap(const Config& config)
    : config_(config), deadline_(now_s() + config.startup_timeout_s) {
  std::string host, port;
  split_host_port(config.coordinator, host, port);
  try {
    if (config.rank == 0) {
      admit_peers(host, port);
    } else {
      join_coordinator(host, port);
    }
  } catch (...) {
    close_sockets();  // no destructor runs for a constructor that throws
    throw;
  }
}

void Bootstrap::admit_peers(const std::string& host, const std::string& port) {
  const int world = config_.world_size;
  in_addr addr{};
  for (std::string why; !listen_address(config_, host, addr, why);) {
    if (now_s() >= deadline_) {
      MOERL_FAIL(Timeout, "rank 0: no address to listen on within ", config_.startup_timeout_s,
                 " s: ", why, " (set MOERL_BIND_ADDRESS to rank 0's own address)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  local_ip_ = ip_text(addr);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  MOERL_CHECK(listen_fd_ >= 0, "socket: ", std::strerror(errno));
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr = addr;
  sa.sin_port = htons(uint16_t(std::stoi(port)));
  // Retryable (not bad input): the port may be held by a group that is just going away.
  MOERL_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0,
              "rank 0 cannot listen on ", local_ip_, ":", port, " (MOERL_COORDINATOR ",
              config_.coordinator, "): ", std::strerror(errno),
              " (is another group using the port? is this rank 0's own address?)");
  MOERL_CHECK(::listen(listen_fd_, int(kMaxHandshakes)) == 0, "listen: ", std::strerror(errno));
  set_nonblocking(listen_fd_);
  if (sa.sin_port == 0) {  // the kernel picked the port: tell the others which
    socklen_t len = sizeof(sa);
    MOERL_CHECK(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) == 0,
                "getsockname: ", std::strerror(errno));
    publish_port(config_.coordinator_port_file, ntohs(sa.sin_port));
  }
  peer_fds_.assign(size_t(world), -1);
  std::vector<Handshake> open;
  struct CloseOpen {  // whichever way this returns, no handshake's socket is left open
    std::vector<Handshake>& open;
    ~CloseOpen() {
      for (const Handshake& h : open) ::close(h.fd);
    }
  } close_open{open};
  int connected = 1, refused = 0;
  const auto drop = [&](size_t i) {
    ::close(open[i].fd);
    open.erase(open.begin() + long(i));
    ++refused;
  };
  const auto release = [&](size_t r) {
    ::close(peer_fds_[r]);
    peer_fds_[r] = -1;
    --connected;
  };
  while (connected < world) {
    const double now = now_s();
    for (size_t i = open.size(); i-- > 0;)
      if (now >= open[i].until) drop(i);
    if (now >= deadline_) {
      std::ostringstream missing;
      for (int r = 1; r < world; ++r)
        if (peer_fds_[size_t(r)] < 0) missing << (missing.tellp() > 0 ? ", " : "") << r;
      std::ostringstream strangers;
      if (refused > 0)
        strangers << "; dropped " << refused << " connection(s) that did not prove "
                  << "MOERL_JOB_TOKEN in time (strangers, or ranks with another token)";
      MOERL_FAIL(Timeout, "rank 0: timed out after ", config_.startup_timeout_s,
                 " s waiting for rank(s) ", missing.str(), " to connect to the coordinator ",
                 config_.coordinator, " (dead, not started or cannot reach it)",
                 strangers.str());
    }
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    double wake = deadline_;
    for (const Handshake& h : open) {
      fds.push_back({h.fd, POLLIN, 0});
      wake = std::min(wake, h.until);
    }
    // Admitted ranks wake rank 0 only by hanging up (what they send is read by allgather).
    for (const int fd : peer_fds_)
      if (fd >= 0) fds.push_back({fd, POLLRDHUP, 0});
    ::poll(fds.data(), fds.size(), remaining_ms(wake));
    // Hellos: read no more than one hello from each; a wrong magic or MAC drops it.
    for (size_t i = open.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      Handshake& h = open[i];
      auto* into = reinterpret_cast<uint8_t*>(&h.hello) + h.got;
      const ssize_t k = ::recv(h.fd, into, sizeof(Hello) - h.got, 0);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (k <= 0) {  // closed before its hello (a port scan), or reset
        drop(i);
        continue;
      }
      h.got += size_t(k);
      if (h.got >= 8 && (h.hello.magic != kMagic || h.hello.version != kVersion)) {
        drop(i);  // not one of ours (a health check, an old binary, garbage)
        continue;
      }
      if (h.got < sizeof(Hello)) continue;
      if (!same_mac(job_mac(config_.job_token, "hello", h.challenge.nonce, h.hello.rank,
                            h.hello.world_size, h.hello.nonce),
                    h.hello.mac)) {
        drop(i);  // does not know the job token: another job's rank, or a stranger
        continue;
      }
      // The peer proved the token: it is this job's, and a mismatch is the job's own mistake.
      MOERL_CHECK_INPUT(h.hello.world_size == world, "rank ", h.hello.rank,
                        " says MOERL_WORLD_SIZE=", h.hello.world_size, " but rank 0 has ", world);
      MOERL_CHECK_INPUT(h.hello.rank > 0 && h.hello.rank < world, "a rank claims MOERL_RANK=",
                        h.hello.rank, ", outside 1..", world - 1);
      const size_t r = size_t(h.hello.rank);
      if (peer_fds_[r] >= 0 && hung_up(peer_fds_[r])) release(r);  // a replacement: see above
      if (peer_fds_[r] >= 0) {
        // A second live claim: a replacement arrived while the rank it replaces still holds its
        // place (its process is going away, unseen yet). Nobody is to blame and nobody can
        // tell which is current: this attempt ends, every rank restarts and meets again.
        MOERL_FAIL(PeerFailure, "rank 0: two processes claim MOERL_RANK=", h.hello.rank,
                   " during one rendezvous (a replacement arrived while the rank it replaces "
                   "was still connected): this rendezvous ends and every rank restarts");
      }
      const Mac mac = job_mac(config_.job_token, "welcome", h.hello.nonce, h.hello.rank, world,
                              h.challenge.nonce);
      Welcome welcome{};
      std::memcpy(welcome.mac, mac.data(), kMacBytes);
      int err = 0;
      if (move_within(true, h.fd, &welcome, sizeof(welcome), h.until, &err) != Moved::Done) {
        drop(i);
        continue;
      }
      peer_fds_[r] = h.fd;
      open.erase(open.begin() + long(i));
      ++connected;
    }
    // Admitted ranks that hung up before the rendezvous ended give their place back: nothing
    // has been exchanged yet, so a replacement may take it without restarting anyone.
    for (size_t r = 1; r < size_t(world); ++r)
      if (peer_fds_[r] >= 0 && hung_up(peer_fds_[r])) release(r);
    // New connections: each gets its challenge at once; too many open, the oldest gives way.
    for (;;) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) break;  // none left (or one reset before it was accepted)
      set_nonblocking(fd);
      if (open.size() >= kMaxHandshakes) drop(0);
      Handshake h;
      h.fd = fd;
      h.until = now_s() + kHandshakeTimeoutS;
      h.challenge.magic = kChallengeMagic;
      h.challenge.version = kVersion;
      fill_random(h.challenge.nonce, kNonceBytes);
      open.push_back(h);
      int err = 0;
      if (move_within(true, fd, &open.back().challenge, sizeof(Challenge), h.until, &err) !=
          Moved::Done)
        drop(open.size() - 1);
    }
  }
  // Every rank is in: nobody else is admitted, so later connections are refused outright.
  ::close(listen_fd_);
  listen_fd_ = -1;
}

void Bootstrap::join_coordinator(const std::string& host, const std::string& coordinator_port) {
  const int self = config_.rank, world = config_.world_size;
  std::string last_error = "no attempt";
  std::string port = coordinator_port == "0" ? "" : coordinator_port;  // "": not published yet
  for (;;) {
    if (now_s() >= deadline_) {
      MOERL_FAIL(Timeout, "rank ", self, ": could not join the coordinator ",
                 config_.coordinator, " (rank 0) within ", config_.startup_timeout_s, " s: ",
                 last_error);
    }
    if (port.empty() && !published_port(config_.coordinator_port_file, port, last_error)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const int fd = connect_once(host, port, deadline_, last_error);
    if (fd >= 0) {
      sockaddr_in mine{}, theirs{};
      const bool connected = socket_ends(fd, mine, theirs);
      // Connecting to a local port nobody listens on can connect the socket to itself.
      const bool to_itself =
          mine.sin_port == theirs.sin_port && mine.sin_addr.s_addr == theirs.sin_addr.s_addr;
      const double until = std::min(deadline_, now_s() + kHandshakeTimeoutS);
      Challenge challenge{};
      int err = 0;
      if (!connected) {
        last_error = "the connection to rank 0 was reset";
      } else if (to_itself) {
        last_error = "connection refused (rank 0 is not listening yet)";
      } else if (move_within(false, fd, &challenge, sizeof(challenge), until, &err) !=
                 Moved::Done) {
        last_error = "rank 0 accepted the connection but sent no challenge";
      } else if (challenge.magic != kChallengeMagic || challenge.version != kVersion) {
        last_error = "something other than a rank 0 of this version answers at that address";
      } else {
        Hello hello{kMagic, kVersion, self, world, {}, {}};
        fill_random(hello.nonce, kNonceBytes);
        const Mac mac =
            job_mac(config_.job_token, "hello", challenge.nonce, self, world, hello.nonce);
        std::memcpy(hello.mac, mac.data(), kMacBytes);
        Welcome welcome{};
        if (move_within(true, fd, &hello, sizeof(hello), until, &err) != Moved::Done ||
            move_within(false, fd, &welcome, sizeof(welcome), until, &err) != Moved::Done) {
          last_error = "rank 0 refused this rank (is MOERL_JOB_TOKEN the same on every rank?)";
        } else if (!same_mac(job_mac(config_.job_token, "welcome", hello.nonce, self, world,
                                     challenge.nonce),
                             welcome.mac)) {
          last_error = "the process at that address could not prove MOERL_JOB_TOKEN (it is not "
                       "this job's rank 0)";
        } else {
          peer_fds_.assign(1, fd);
          local_ip_ = ip_text(mine.sin_addr);
          return;
        }
      }
      ::close(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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

Bootstrap::~Bootstrap() { close_sockets(); }

void Bootstrap::close_sockets() noexcept {
  for (int& fd : peer_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

std::vector<std::vector<uint8_t>> Bootstrap::allgather(const std::vector<uint8_t>& mine) {
  const int self = config_.rank, world = config_.world_size;
  const double t = config_.startup_timeout_s;  // the peers wait for the slowest rank to join
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
