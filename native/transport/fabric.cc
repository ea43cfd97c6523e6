// libfabric RDM endpoint (see fabric.h).
#include "transport/fabric.h"

#include <rdma/fi_cm.h>        // fi_getname, fi_setname
#include <rdma/fi_endpoint.h>  // fi_endpoint, fi_ep_bind, fi_enable
#include <rdma/fi_eq.h>        // fi_cq_open, fi_cq_read, fi_cq_readerr
#include <rdma/fi_errno.h>     // FI_EAGAIN, FI_EAVAIL, fi_strerror
#include <rdma/fi_tagged.h>    // fi_tsend, fi_trecv
#include <sys/stat.h>          // stat of the shm region
#include <unistd.h>            // getpid, geteuid

#include <cerrno>   // errno
#include <cstring>  // strdup, std::strerror
#include <ios>      // std::oct for the region's mode
#include <random>   // std::random_device for a unique shm endpoint name

#include "common/check.h"
#include "transport/locked_memory.h"

namespace moerl::transport {
namespace {

#define FI_CALL(call, what)                                                          \
  do {                                                                               \
    const int fi_rc_ = (call);                                                       \
    MOERL_CHECK(fi_rc_ == 0, "rank ", rank_, ": ", what, " failed: ",                \
                fi_strerror(-fi_rc_), " (", fi_rc_, ")");                            \
  } while (0)

}  // namespace

Fabric::Fabric(const std::string& provider, const std::string& local_ip, int rank,
               bool register_all)
    : rank_(rank) {
  // Before libfabric: too little locked memory fails inside efa in ways that name nothing.
  check_locked_memory(provider, rank);
  fi_info* hints = fi_allocinfo();
  MOERL_CHECK(hints != nullptr, "fi_allocinfo failed");
  hints->caps = FI_TAGGED | FI_DIRECTED_RECV;  // receives bound to a peer's address
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;  // every operation carries an fi_context2
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  // tcp binds to the interface that reaches the coordinator: on a pod, the pod network.
  const bool bind_ip = provider == "tcp" && !local_ip.empty();
  fi_info* found = nullptr;
  const int rc = fi_getinfo(FI_VERSION(1, 9), bind_ip ? local_ip.c_str() : nullptr,
                            bind_ip ? "0" : nullptr, bind_ip ? FI_SOURCE : 0, hints, &found);
  fi_freeinfo(hints);
  MOERL_CHECK_INPUT(rc == 0 && found != nullptr, "rank ", rank,
                    ": libfabric has no RDM endpoint with tagged messages for MOERL_FI_PROVIDER=",
                    provider, (bind_ip ? " on " + local_ip : std::string()), ": ", fi_strerror(-rc),
                    ". Check `fi_info -p ", provider, "`; efa needs the EFA device and the AWS "
                    "libfabric, shm needs a shared /dev/shm between ranks");
  // Take the first match; keep our own copy so the list can be freed.
  info_ = fi_dupinfo(found);
  fi_freeinfo(found);
  needs_local_mr_ = register_all || (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
  max_msg_size_ = info_->ep_attr->max_msg_size;

  FI_CALL(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
  FI_CALL(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;  // with the length of what arrived
  cq_attr.size = 4096;
  FI_CALL(fi_cq_open(domain_, &cq_attr, &cq_, nullptr), "fi_cq_open");
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  FI_CALL(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
  FI_CALL(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
  if (std::string(info_->fabric_attr->prov_name) == "shm") {
    // shm names its shared-memory region after the endpoint. The default name is derived
    // from the pid, which collides across PID namespaces (containers sharing /dev/shm) and
    // with regions left behind by a killed rank whose pid was reused. A random suffix makes
    // the name unique without relying on luck.
    std::random_device rd;
    char name[64];
    snprintf(name, sizeof(name), "moerl_%d_%d_%08x%08x", int(getpid()), rank, rd(), rd());
    FI_CALL(fi_setname(&ep_->fid, name, strlen(name) + 1), "fi_setname (shm endpoint name)");
    shm_region_ = std::string("/dev/shm/") + name;
  }
  FI_CALL(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
  FI_CALL(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  FI_CALL(fi_enable(ep_), "fi_enable");
  if (!shm_region_.empty()) check_private_region();
}

// shm's directed receives cannot tell a process that maps this rank's region from the peer it
// claims to be, so the region's mode is the boundary: only this uid may map it (0600). A
// process of another uid cannot send as a peer; one of this uid could ptrace the rank anyway.
void Fabric::check_private_region() const {
  struct stat st{};
  MOERL_CHECK(::stat(shm_region_.c_str(), &st) == 0, "rank ", rank_, ": the shm region ",
              shm_region_, " of this endpoint is missing: ", std::strerror(errno));
  MOERL_CHECK((st.st_mode & 077) == 0 && st.st_uid == ::geteuid(), "rank ", rank_,
              ": the shm region ", shm_region_, " has mode 0", std::oct, st.st_mode & 0777,
              std::dec, " and owner uid ", st.st_uid, ": a process of another uid could map it "
              "and send as a peer (this libfabric's shm must create it 0600)");
}

Fabric::~Fabric() {
  // Close in reverse order of creation; errors here cannot be acted on.
  if (ep_ != nullptr) fi_close(&ep_->fid);
  if (av_ != nullptr) fi_close(&av_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  if (domain_ != nullptr) fi_close(&domain_->fid);
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  if (info_ != nullptr) fi_freeinfo(info_);
}

std::vector<uint8_t> Fabric::address() const {
  std::vector<uint8_t> addr(256);
  size_t len = addr.size();
  int rc = fi_getname(&ep_->fid, addr.data(), &len);
  if (rc == -FI_ETOOSMALL) {
    addr.resize(len);
    rc = fi_getname(&ep_->fid, addr.data(), &len);
  }
  MOERL_CHECK(rc == 0, "rank ", rank_, ": fi_getname failed: ", fi_strerror(-rc));
  addr.resize(len);
  return addr;
}

void Fabric::insert_peers(const std::vector<std::vector<uint8_t>>& addresses) {
  peers_.assign(addresses.size(), FI_ADDR_NOTAVAIL);
  for (size_t r = 0; r < addresses.size(); ++r) {
    const int n = fi_av_insert(av_, addresses[r].data(), 1, &peers_[r], 0, nullptr);
    MOERL_CHECK(n == 1, "rank ", rank_, ": fi_av_insert of rank ", r, "'s address failed");
  }
}

std::string Fabric::provider_name() const { return info_->fabric_attr->prov_name; }

fid_mr* Fabric::register_memory(void* data, size_t bytes, bool is_send) {
  fid_mr* mr = nullptr;
  FI_CALL(fi_mr_reg(domain_, data, bytes, is_send ? FI_SEND : FI_RECV, 0, next_mr_key_++, 0, &mr,
                    nullptr),
          "fi_mr_reg");
  return mr;
}

void* Fabric::descriptor(fid_mr* mr) { return mr == nullptr ? nullptr : fi_mr_desc(mr); }

void Fabric::deregister(fid_mr* mr) {
  if (mr != nullptr) fi_close(&mr->fid);
}

int Fabric::try_send(int peer, const void* data, size_t bytes, void* desc, uint64_t tag,
                     fi_context2* ctx) {
  const ssize_t rc = fi_tsend(ep_, data, bytes, desc, peers_[size_t(peer)], tag, ctx);
  if (rc == -FI_EAGAIN) return -FI_EAGAIN;
  MOERL_CHECK(rc == 0, "rank ", rank_, ": fi_tsend to rank ", peer, " failed: ",
              fi_strerror(int(-rc)));
  return 0;
}

int Fabric::try_recv(int peer, void* data, size_t bytes, void* desc, uint64_t tag,
                     fi_context2* ctx) {
  const ssize_t rc = fi_trecv(ep_, data, bytes, desc, peers_[size_t(peer)], tag, 0, ctx);
  if (rc == -FI_EAGAIN) return -FI_EAGAIN;
  MOERL_CHECK(rc == 0, "rank ", rank_, ": fi_trecv from rank ", peer, " failed: ",
              fi_strerror(int(-rc)));
  return 0;
}

size_t Fabric::poll(Completion* out, size_t max) {
  fi_cq_msg_entry entries[64];
  const ssize_t n = fi_cq_read(cq_, entries, std::min<size_t>(max, 64));
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i)
      out[i] = Completion{entries[i].op_context, true, entries[i].len, {}};
    return size_t(n);
  }
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    fi_cq_readerr(cq_, &err, 0);
    char buf[256] = {0};
    const char* detail = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
    out[0] = Completion{err.op_context, false, err.len,
                        std::string(fi_strerror(err.err)) + " (" + (detail ? detail : "") + ")"};
    return 1;
  }
  MOERL_FAIL(Internal, "rank ", rank_, ": fi_cq_read failed: ", fi_strerror(int(-n)));
}

}  // namespace moerl::transport
