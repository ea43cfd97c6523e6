// One rank of a multi-process EP / collectives test. The GoogleTest binaries spawn R of these
// with the rank env contract set; each checks its own outputs against the single-process
// reference (ep_reference.h) and exits 0 on a bitwise match, 1 on a mismatch (printing the
// first difference), 2/3 on an exception (bad input / peer failure or timeout).
//
// usage: ep_test_rank ep        <experts> <topk> <hidden> <tokens> <token_rule> <routing>
//                              <dtype> <seed>
//        ep_test_rank allreduce <n>            (allreduce, broadcast, gather, barrier)
//        ep_test_rank loop      <tokens> [fail_rank]  (dispatch+combine until a peer fails)
//        ep_test_rank stranger  (2 ranks: an endpoint outside the group forges rank 1's message)
//        ep_test_rank stranger_uid  (2 ranks, as root: the same from a process of uid 65534)
//        ep_test_rank forge <address hex> <tag>  (the stranger of stranger_uid; not a rank)
//        ep_test_rank forged_counts <num_rows>  (2 ranks: rank 1 sends rank 0 a counts message
//                              with that num_rows in place of a dispatch's own)
#include <cmath>     // std::fabs
#include <cstdio>    // std::fprintf
#include <cstdlib>   // std::atoi, std::atoll
#include <cstring>   // std::memcmp, std::strcmp
#include <string>

#include <spawn.h>     // posix_spawnp for the stranger of another uid
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // readlink, environ

#include "common/check.h"
#include "ep/dtype.h"
#include "ep/ep.h"
#include "ep_reference.h"
#include "test_rank.h"  // g_rank, EXPECT_SAME, parse_dtype
#include "transport/clock.h"
#include "transport/communicator.h"
#include "transport/fabric.h"  // the stranger's endpoint

using namespace moerl;
using namespace moerl::ep;
using namespace moerl::ep::testing;

namespace {

int run_ep(transport::Communicator& comm, const Case& c) {
  const int R = comm.world_size(), self = comm.rank(), K = c.num_topk;
  const int64_t C = c.hidden;
  std::vector<RankInputs> all;
  for (int r = 0; r < R; ++r) all.push_back(make_inputs(c, r));
  const RankInputs& in = all[size_t(self)];
  const Expected ex = expected_dispatch(c, all, self);
  const int64_t N = int64_t(ex.src_rank.size());

  Buffer buffer(comm, c.num_experts);
  Layout layout;
  buffer.get_dispatch_layout(in.topk_idx.data(), in.num_tokens, K, layout);
  DispatchOut out;
  buffer.dispatch({in.x.data(), c.dtype, in.num_tokens, C}, in.x_scales.data(),
                  in.topk_idx.data(), in.topk_weights.data(), layout, out);

  // dispatch: rows, scales, local ids, weights, per-expert counts.
  EXPECT_SAME(out.recv_x.rows == N, "received %lld rows, expected %lld", (long long)out.recv_x.rows,
              (long long)N);
  const size_t row_bytes = size_t(C) * dtype_bytes(c.dtype);
  for (int64_t n = 0; n < N; ++n) {
    const RankInputs& src = all[size_t(ex.src_rank[size_t(n)])];
    const int64_t t = ex.src_token[size_t(n)];
    EXPECT_SAME(std::memcmp(out.recv_x.bytes.data() + n * row_bytes, src.x.data() + t * row_bytes,
                            row_bytes) == 0,
                "recv_x row %lld (rank %d token %lld)", (long long)n, ex.src_rank[size_t(n)],
                (long long)t);
    for (int k = 0; k < K; ++k) {
      EXPECT_SAME(out.recv_topk_idx[size_t(n * K + k)] == ex.recv_topk_idx[size_t(n * K + k)],
                  "recv_topk_idx[%lld,%d]=%lld expected %lld", (long long)n, k,
                  (long long)out.recv_topk_idx[size_t(n * K + k)],
                  (long long)ex.recv_topk_idx[size_t(n * K + k)]);
      EXPECT_SAME(out.recv_topk_weights[size_t(n * K + k)] == src.topk_weights[size_t(t * K + k)],
                  "recv_topk_weights[%lld,%d]", (long long)n, k);
    }
    if (c.dtype == DType::F8E4M3) {
      const int64_t B = C / 128;
      EXPECT_SAME(std::memcmp(out.recv_x_scales.data() + n * B, src.x_scales.data() + t * B,
                              size_t(B) * 4) == 0, "recv_x_scales row %lld", (long long)n);
      // Stated FP8 tolerance against the unquantized input: |err| <= |x|/16 + scale * 2^-9.
      for (int64_t ch = 0; ch < C; ++ch) {
        const float scale = out.recv_x_scales[size_t(n * B + ch / 128)];
        const float deq = fp8_e4m3_to_f32(out.recv_x.bytes[size_t(n * C + ch)]) * scale;
        const float orig = src.x_f32[size_t(t * C + ch)];
        EXPECT_SAME(std::fabs(deq - orig) <= std::fabs(orig) / 16 + scale * 0x1.0p-9f,
                    "fp8 row %lld ch %lld: %g vs %g", (long long)n, (long long)ch, deq, orig);
      }
    }
  }
  EXPECT_SAME(out.num_recv_tokens_per_expert == ex.num_recv_tokens_per_expert,
              "num_recv_tokens_per_expert differs");
  if (c.dtype == DType::F8E4M3) return 0;  // combine takes fp32/bf16 only

  // combine: scale rows per destination (the test's expert step), sum back, compare bits.
  Tensor y;
  y.resize(c.dtype, N, C);
  for (int64_t i = 0; i < N * C; ++i) {
    const float scale = expert_scale(self);
    if (c.dtype == DType::F32) {
      y.data<float>()[i] = out.recv_x.data<float>()[i] * scale;
    } else {
      y.data<uint16_t>()[i] = f32_to_bf16(bf16_to_f32(out.recv_x.data<uint16_t>()[i]) * scale);
    }
  }
  Tensor combined;
  buffer.combine(y.view(), out.handle, combined);
  const std::vector<float> ref = expected_combine(c, in, self);
  for (int64_t i = 0; i < in.num_tokens * C; ++i) {
    if (c.dtype == DType::F32) {
      EXPECT_SAME(std::memcmp(&combined.data<float>()[i], &ref[size_t(i)], 4) == 0,
                  "combine[%lld]=%.9g expected %.9g", (long long)i, combined.data<float>()[i],
                  ref[size_t(i)]);
    } else {
      EXPECT_SAME(combined.data<uint16_t>()[i] == f32_to_bf16(ref[size_t(i)]),
                  "combine[%lld] bf16 %04x expected %04x", (long long)i,
                  combined.data<uint16_t>()[i], f32_to_bf16(ref[size_t(i)]));
    }
  }

  // Backward shapes: cached dispatch of a [T, 3] fp32 tensor, and combine of the [N, K]
  // per-slot weights masked to local experts, which must give back topk_weights exactly
  // (one rank contributes each slot, the others add zeros).
  const int64_t C2 = 3;
  std::vector<float> g(size_t(in.num_tokens * C2));
  for (int64_t t = 0; t < in.num_tokens; ++t)
    for (int64_t ch = 0; ch < C2; ++ch) g[size_t(t * C2 + ch)] = float(self * 100000 + t * 10 + ch);
  Tensor recv_g;
  buffer.dispatch({g.data(), DType::F32, in.num_tokens, C2}, nullptr, out.handle, recv_g, nullptr);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C2; ++ch)
      EXPECT_SAME(recv_g.data<float>()[n * C2 + ch] ==
                      float(ex.src_rank[size_t(n)] * 100000 + ex.src_token[size_t(n)] * 10 + ch),
                  "cached dispatch row %lld", (long long)n);
  std::vector<float> w(size_t(N * K));
  for (int64_t i = 0; i < N * K; ++i)
    w[size_t(i)] = out.recv_topk_idx[size_t(i)] >= 0 ? out.recv_topk_weights[size_t(i)] : 0.0f;
  Tensor grad_w;
  buffer.combine({w.data(), DType::F32, N, K}, out.handle, grad_w);
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    for (int k = 0; k < K; ++k) {
      const bool valid = in.topk_idx[size_t(t * K + k)] >= 0;
      const float want = valid ? in.topk_weights[size_t(t * K + k)] : 0.0f;
      EXPECT_SAME(grad_w.data<float>()[t * K + k] == want, "combine of weights [%lld,%d]",
                  (long long)t, k);
    }
  }
  return 0;
}

int run_allreduce(transport::Communicator& comm, size_t n) {
  const int R = comm.world_size();
  std::vector<std::vector<float>> all(static_cast<size_t>(R), std::vector<float>(n));
  for (int r = 0; r < R; ++r) {
    Rng rng(uint64_t(r) + 99);
    for (auto& v : all[size_t(r)]) v = float(rng.uniform() * 2 - 1);
  }
  std::vector<float> data = all[size_t(comm.rank())];
  comm.allreduce_sum(data.data(), n);
  for (size_t i = 0; i < n; ++i) {
    float ref = all[0][i];
    for (int r = 1; r < R; ++r) ref += all[size_t(r)][i];
    EXPECT_SAME(std::memcmp(&data[i], &ref, 4) == 0, "allreduce[%zu]=%.9g expected %.9g", i,
                data[i], ref);
  }
  std::vector<uint8_t> blob(n * 3 + 1, uint8_t(comm.rank() == R - 1 ? 7 : 0));
  comm.broadcast(blob.data(), blob.size(), R - 1);
  for (uint8_t b : blob) EXPECT_SAME(b == 7, "broadcast byte");
  // gather to the first and to the last rank: row r holds rank r's bytes
  for (int root : {0, R - 1}) {
    std::vector<uint8_t> mine(n + 1, uint8_t(comm.rank() + 1)), rows;
    if (comm.rank() == root) rows.assign(mine.size() * size_t(R), 0);
    comm.gather(mine.data(), mine.size(), rows.data(), root);
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_SAME(rows[i] == uint8_t(i / mine.size() + 1), "gather to %d byte %zu", root, i);
  }
  comm.barrier();
  return 0;
}

// Dispatch + combine until a peer fails; rank `fail_rank` throws after a few iterations
// (an injected error, as a rank hitting a bug would).
int run_loop(transport::Communicator& comm, int64_t tokens, int fail_rank) {
  Case c;
  c.world_size = comm.world_size();
  c.tokens = tokens;
  c.num_experts = 2 * c.world_size;
  const RankInputs in = make_inputs(c, comm.rank());
  Buffer buffer(comm, c.num_experts);
  Layout layout;
  buffer.get_dispatch_layout(in.topk_idx.data(), in.num_tokens, c.num_topk, layout);
  DispatchOut out;
  Tensor combined;
  std::fprintf(stderr, "rank %d: looping\n", comm.rank());
  for (int iteration = 0;; ++iteration) {
    MOERL_CHECK(!(comm.rank() == fail_rank && iteration == 5), "rank ", comm.rank(),
                ": injected failure");
    buffer.dispatch({in.x.data(), c.dtype, in.num_tokens, c.hidden}, nullptr, in.topk_idx.data(),
                    in.topk_weights.data(), layout, out);
    buffer.combine(out.recv_x.view(), out.handle, combined);
  }
}

// The tag a message of (op, source rank, part, chunk 0) carries, as communicator.cc lays it
// out: a stranger can compute it.
uint64_t guessed_tag(uint32_t op, int src, int part) {
  return (uint64_t(op & 0xffffffu) << 36) | (uint64_t(src & 0xffff) << 20) |
         (uint64_t(part & 0xff) << 12);
}

constexpr size_t kMessageBytes = 64;

// Sends `forged` to the one peer of `stranger` with `tag`; true once the send completed.
bool send_forged(transport::Fabric& stranger, uint64_t tag) {
  std::vector<uint8_t> forged(kMessageBytes, 'F');
  fi_context2 context{};
  const double deadline = transport::now_s() + 60;
  while (stranger.try_send(0, forged.data(), forged.size(), nullptr, tag, &context) != 0) {
    transport::Completion c[4];
    stranger.poll(c, 4);
    MOERL_CHECK(transport::now_s() < deadline, "the stranger could not post its message");
  }
  for (;;) {
    transport::Completion c[4];
    const size_t n = stranger.poll(c, 4);
    for (size_t i = 0; i < n; ++i) {
      if (!c[i].ok) std::fprintf(stderr, "the stranger's send failed: %s\n", c[i].error.c_str());
      return c[i].ok;
    }
    MOERL_CHECK(transport::now_s() < deadline, "the stranger's send did not complete within 60 s");
  }
}

// The stranger of stranger_uid, a process of another uid: 1 if its message reached rank 0.
int run_forge(const std::string& address_hex, uint64_t tag) {
  std::vector<uint8_t> address;
  for (size_t i = 0; i + 1 < address_hex.size(); i += 2)
    address.push_back(uint8_t(std::stoi(address_hex.substr(i, 2), nullptr, 16)));
  try {
    transport::Fabric stranger("shm", "", 1, false);
    stranger.insert_peers({address});
    if (send_forged(stranger, tag)) {
      std::fprintf(stderr, "the stranger (uid %d) sent rank 0 its message\n", int(::getuid()));
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "the stranger could not reach rank 0: %s\n", e.what());
  }
  return 0;
}

// Runs run_forge as uid and gid 65534 (util-linux's setpriv, started by posix_spawn: no forked
// copy of this rank's endpoint); its exit code.
int forge_as_nobody(const std::vector<uint8_t>& address, uint64_t tag) {
  std::string hex;
  char byte[3];
  for (uint8_t b : address) {
    std::snprintf(byte, sizeof(byte), "%02x", b);
    hex += byte;
  }
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  MOERL_CHECK(n > 0, "readlink /proc/self/exe failed");
  self.resize(size_t(n));
  std::string tag_text = std::to_string(tag);
  std::vector<std::string> args = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                   self,      "forge",         hex,             tag_text};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = -1;
  MOERL_CHECK(::posix_spawnp(&child, "setpriv", nullptr, nullptr, argv.data(), environ) == 0,
              "posix_spawnp setpriv failed");
  int status = 0;
  MOERL_CHECK(::waitpid(child, &status, 0) == child, "waitpid failed");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Rank 0 waits for a message from rank 1. Before rank 1 sends it, a stranger (an endpoint
// that never joined the rendezvous, made in rank 1's process, or with `other_uid` in a process
// of uid 65534) sends rank 0 a well-formed message with the tag rank 1's will carry. Rank 0
// must get rank 1's bytes, not the stranger's.
int run_stranger(transport::Communicator& comm, bool other_uid) {
  EXPECT_SAME(comm.world_size() == 2, "the stranger case needs 2 ranks");
  std::vector<uint8_t> address = comm.address();
  uint64_t length = address.size();
  comm.broadcast(&length, sizeof(length), 0);
  address.resize(size_t(length));
  comm.broadcast(address.data(), address.size(), 0);
  const uint32_t op = comm.begin_op();
  std::vector<uint8_t> message(kMessageBytes, 'G');  // rank 1's genuine bytes
  if (comm.rank() == 0) {
    std::vector<uint8_t> got(message.size(), 0);
    comm.post_recv(1, got.data(), got.size(), op, 0);
    comm.wait_all("waiting for rank 1's message");
    EXPECT_SAME(got == message, "rank 0 took the stranger's message as rank 1's (got '%c...')",
                got[0]);
  } else if (other_uid) {
    // Rank 1 sends only once the stranger has tried and gone.
    const int forged = forge_as_nobody(address, guessed_tag(op, 1, 0));
    EXPECT_SAME(forged == 0, "the stranger of uid 65534 %s",
                forged == 1 ? "reached rank 0" : "failed to run");
    std::fprintf(stderr, "rank 1: the stranger of uid 65534 tried and was refused\n");
  } else {
    transport::Fabric stranger(comm.config().provider, "127.0.0.1", 1, false);
    stranger.insert_peers({address});
    // Rank 1 sends only once the stranger's message has left (its send completed).
    MOERL_CHECK(send_forged(stranger, guessed_tag(op, 1, 0)), "the stranger's send failed");
    std::fprintf(stderr, "rank 1: the stranger's message was sent\n");
  }
  if (comm.rank() == 1) {
    comm.post_send(0, message.data(), message.size(), op, 0);
    comm.wait_all("sending rank 0 the genuine message");
  }
  comm.barrier();
  return 0;
}

// Rank 0 runs a dispatch; rank 1, in its place, sends the counts message a dispatch sends
// (the wire layout of dispatch.cc) with num_rows as given and one segment of one row. Rank 0
// must fail with a clear error naming rank 1 and the value; rank 1 then sees rank 0 fail.
struct ForgedCounts {
  int64_t num_rows;
  int32_t num_segments;
  int32_t segment_rows[Handle::kMaxSegments];
};

int run_forged_counts(transport::Communicator& comm, int64_t num_rows) {
  EXPECT_SAME(comm.world_size() == 2, "the forged counts case needs 2 ranks");
  Case c;
  c.world_size = 2;
  c.tokens = 16;
  c.num_experts = 4;
  const RankInputs in = make_inputs(c, comm.rank());
  Buffer buffer(comm, c.num_experts);
  if (comm.rank() == 0) {
    Layout layout;
    buffer.get_dispatch_layout(in.topk_idx.data(), in.num_tokens, c.num_topk, layout);
    DispatchOut out;
    buffer.dispatch({in.x.data(), c.dtype, in.num_tokens, c.hidden}, nullptr, in.topk_idx.data(),
                    in.topk_weights.data(), layout, out);
    std::fprintf(stderr, "rank 0: mismatch: dispatch accepted num_rows=%lld from rank 1\n",
                 (long long)num_rows);
    return 1;
  }
  ForgedCounts forged{};
  forged.num_rows = num_rows;
  forged.num_segments = 1;
  forged.segment_rows[0] = 1;
  ForgedCounts from_0{};
  const uint32_t op = comm.begin_op();  // the op of dispatch's counts exchange
  comm.post_recv(0, &from_0, sizeof(from_0), op, 0);
  comm.post_send(0, &forged, sizeof(forged), op, 0);
  comm.wait_all("the forged counts exchange");
  comm.barrier();  // rank 0 fails instead: this throws, naming it
  std::fprintf(stderr, "rank 1: mismatch: rank 0 went on after num_rows=%lld\n",
               (long long)num_rows);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MOERL_CHECK_INPUT(argc >= 2, "usage: ep_test_rank ep|allreduce|loop ...");
    const std::string mode = argv[1];
    if (mode == "forge" && argc == 4) return run_forge(argv[2], std::stoull(argv[3]));
    const transport::Config config = transport::Config::from_env();
    g_rank = config.rank;
    transport::Communicator comm(config);
    if (mode == "allreduce" && argc == 3) return run_allreduce(comm, size_t(std::atoll(argv[2])));
    if (mode == "stranger" && argc == 2) return run_stranger(comm, false);
    if (mode == "stranger_uid" && argc == 2) return run_stranger(comm, true);
    if (mode == "forged_counts" && argc == 3)
      return run_forged_counts(comm, std::atoll(argv[2]));
    if (mode == "loop" && (argc == 3 || argc == 4))
      return run_loop(comm, std::atoll(argv[2]), argc == 4 ? std::atoi(argv[3]) : -1);
    MOERL_CHECK_INPUT(mode == "ep" && argc == 10, "bad arguments for mode ", mode);
    Case c;
    c.world_size = config.world_size;
    c.num_experts = std::atoi(argv[2]);
    c.num_topk = std::atoi(argv[3]);
    c.hidden = std::atoll(argv[4]);
    c.tokens = std::atoll(argv[5]);
    c.token_rule = argv[6];
    c.routing = argv[7];
    c.dtype = parse_dtype(argv[8]);
    c.seed = uint64_t(std::atoll(argv[9]));
    return run_ep(comm, c);
  } catch (const moerl::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return e.kind() == moerl::ErrorKind::BadInput ? 2 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    return 3;
  }
}
