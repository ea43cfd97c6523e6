// One rank of a multi-process test of the low-latency mode (ep/low_latency.h). ep_ll_test
// spawns R of these; each compares its own slots and combine outputs bit for bit with the
// single-process reference (ep_ll_reference.h) and exits 0 on a match, 1 on a mismatch
// (printing the first difference), 2/3 on an exception (bad input / peer failure, timeout).
//
// usage: ep_ll_test_rank ll <experts> <topk> <hidden> <tokens> <token_rule> <routing> <dtype>
//                           <seed> <max_tokens_per_rank> <slot_capacity> plain|overlap
//        ep_ll_test_rank loop <tokens>   (dispatch + combine until a peer fails)
//        ep_ll_test_rank noalloc <tokens> (no operator new in steady-state dispatch + combine)
// overlap runs two micro-batches through two buffers with their sends and receives
// interleaved. A slot overflow is caught, followed by a barrier (the group must still be
// usable), and exits 2 with the message.
#include <cstdio>   // std::fprintf
#include <cstdlib>  // std::atoi, std::atoll
#include <cstring>  // std::memcmp
#include <atomic>
#include <memory>
#include <new>
#include <string>

#include "common/check.h"
#include "ep/dtype.h"
#include "ep/low_latency.h"
#include "ep_ll_reference.h"
#include "test_rank.h"  // g_rank, EXPECT_SAME, parse_dtype
#include "transport/communicator.h"

using namespace moerl;
using namespace moerl::ep;
using namespace moerl::ep::testing;

// C++ allocations of the thread that drives the communicator are counted, for the "no
// allocation per call" check (not the watchdog thread's: its first check of the bootstrap
// connections sizes its buffers whenever the scheduler first runs it; not libfabric's own
// malloc calls: they are the provider's business).
std::atomic<long> g_allocations{0};
thread_local bool t_counted = false;

void* operator new(size_t n) {
  if (t_counted) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace {

// The buffer for case c: T_max tokens per rank, slot capacity P (0 = T_max).
LowLatencyConfig ll_config(const Case& c, DType dispatch, int max_tokens, int slot_capacity = 0) {
  LowLatencyConfig ll;
  ll.num_max_dispatch_tokens_per_rank = max_tokens;
  ll.num_max_tokens_per_slot = slot_capacity;
  ll.hidden = int(c.hidden);
  ll.num_experts = c.num_experts;
  ll.num_topk = c.num_topk;
  ll.dispatch_dtype = dispatch;
  return ll;
}

// A bf16 case of `tokens` tokens per rank (the default routing) for the loop and no-allocation
// modes.
Case bf16_case(const transport::Communicator& comm, int64_t tokens, int experts_per_rank,
               int topk, int64_t hidden) {
  Case c;
  c.world_size = comm.world_size();
  c.tokens = tokens;
  c.num_experts = experts_per_rank * c.world_size;
  c.num_topk = topk;
  c.hidden = hidden;
  c.dtype = DType::BF16;
  return c;
}

struct MicroBatch {
  Case c;
  std::vector<RankInputs> all;
  std::unique_ptr<LowLatencyBuffer> buffer;
  LowLatencyRecv recv;
  Tensor y, out, out_unweighted;
};

void send_dispatch(MicroBatch& m, int self) {
  const RankInputs& in = m.all[size_t(self)];
  // fp8 dispatch quantizes on send: the input is the unrounded fp32 tensor.
  if (m.c.dtype == DType::F8E4M3)
    m.buffer->dispatch_send({in.x_f32.data(), DType::F32, in.num_tokens, m.c.hidden},
                            in.topk_idx.data());
  else
    m.buffer->dispatch_send({in.x.data(), m.c.dtype, in.num_tokens, m.c.hidden},
                            in.topk_idx.data());
}

// Checks the slots against the reference and computes the expert step into m.y.
int check_slots(MicroBatch& m, int self) {
  const Case& c = m.c;
  const int R = c.world_size, L = c.num_experts / R;
  const int64_t C = c.hidden, P = m.buffer->slot_capacity(), S = C / 128;
  const auto slots = expected_ll_slots(c, m.all, self);
  const DType ydt = c.dtype == DType::BF16 ? DType::BF16 : DType::F32;
  m.y.resize(ydt, int64_t(L) * R * P, C);
  const size_t row_bytes = size_t(C) * dtype_bytes(c.dtype);
  const uint8_t* rx = static_cast<const uint8_t*>(m.recv.recv_x);
  for (int e = 0; e < L; ++e) {
    int64_t total = 0;
    for (int s = 0; s < R; ++s) {
      const std::vector<int64_t>& want = slots[size_t(e * R + s)];
      total += int64_t(want.size());
      EXPECT_SAME(m.recv.recv_count[e * R + s] == int32_t(want.size()),
                  "slot (expert %d, source %d) holds %d rows, expected %zu", e, s,
                  m.recv.recv_count[e * R + s], want.size());
      const RankInputs& src = m.all[size_t(s)];
      for (size_t i = 0; i < want.size(); ++i) {
        const int64_t row = (int64_t(e) * R + s) * P + int64_t(i), t = want[i];
        EXPECT_SAME(std::memcmp(rx + size_t(row) * row_bytes, src.x.data() + t * row_bytes,
                                row_bytes) == 0,
                    "slot (expert %d, source %d) row %zu (token %lld)", e, s, i, (long long)t);
        if (c.dtype == DType::F8E4M3)
          EXPECT_SAME(std::memcmp(m.recv.recv_x_scales + row * S, src.x_scales.data() + t * S,
                                  size_t(S) * 4) == 0,
                      "slot (expert %d, source %d) row %zu scales", e, s, i);
        for (int64_t ch = 0; ch < C; ++ch) {
          const float v = ll_expert_output(c, src, t, ch, int64_t(self) * L + e);
          if (ydt == DType::BF16) m.y.data<uint16_t>()[row * C + ch] = f32_to_bf16(v);
          else m.y.data<float>()[row * C + ch] = v;
        }
      }
    }
    EXPECT_SAME(m.recv.num_recv_tokens_per_expert[e] == total, "num_recv_tokens_per_expert[%d]",
                e);
  }
  return 0;
}

int check_combine(const MicroBatch& m, const Tensor& out, int self, bool use_weights) {
  const RankInputs& in = m.all[size_t(self)];
  const std::vector<float> ref = expected_ll_combine(m.c, in, use_weights);
  EXPECT_SAME(out.rows == in.num_tokens && out.cols == m.c.hidden, "combine output shape");
  for (int64_t i = 0; i < in.num_tokens * m.c.hidden; ++i) {
    if (out.dtype == DType::BF16)
      EXPECT_SAME(out.data<uint16_t>()[i] == f32_to_bf16(ref[size_t(i)]),
                  "combine[%lld] bf16 %04x expected %04x (weights %d)", (long long)i,
                  out.data<uint16_t>()[i], f32_to_bf16(ref[size_t(i)]), int(use_weights));
    else
      EXPECT_SAME(std::memcmp(&out.data<float>()[i], &ref[size_t(i)], 4) == 0,
                  "combine[%lld]=%.9g expected %.9g (weights %d)", (long long)i,
                  out.data<float>()[i], ref[size_t(i)], int(use_weights));
  }
  return 0;
}

int run_ll(transport::Communicator& comm, const Case& base, const LowLatencyConfig& config,
           bool overlap) {
  const int self = comm.rank();
  std::vector<MicroBatch> batches(overlap ? 2 : 1);
  for (size_t b = 0; b < batches.size(); ++b) {
    MicroBatch& m = batches[b];
    m.c = base;
    m.c.seed = base.seed + 101 * b;
    for (int r = 0; r < comm.world_size(); ++r) m.all.push_back(make_inputs(m.c, r));
    m.buffer = std::make_unique<LowLatencyBuffer>(comm, config);
  }
  // ep_ll_test checks this line: a case meant for one dispatch scheme must take it.
  if (self == 0)
    std::fprintf(stderr, "low-latency path: %s, dispatch %s\n",
                 batches[0].buffer->transport_path(),
                 batches[0].buffer->dispatch_packed() ? "packed per peer" : "per slot");
  try {
    // overlap: both micro-batches' sends go out before either receive hook runs.
    for (MicroBatch& m : batches) send_dispatch(m, self);
    for (MicroBatch& m : batches) m.buffer->dispatch_recv(m.recv);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::BadInput) throw;
    std::fprintf(stderr, "%s\n", e.what());
    comm.barrier();  // an overflow leaves the group consistent and usable
    return 2;
  }
  for (MicroBatch& m : batches)
    if (check_slots(m, self) != 0) return 1;
  for (MicroBatch& m : batches) m.buffer->combine_send(m.y.view());
  for (size_t b = batches.size(); b-- > 0;)
    batches[b].buffer->combine_recv(batches[b].all[size_t(self)].topk_weights.data(),
                                    batches[b].out);
  for (MicroBatch& m : batches) {
    if (check_combine(m, m.out, self, true) != 0) return 1;
    m.buffer->combine(m.y.view(), nullptr, m.out_unweighted);  // a second combine, w = 1
    if (check_combine(m, m.out_unweighted, self, false) != 0) return 1;
  }
  return 0;
}

// Two micro-batches' worth of warm-up, then dispatch + combine (split hooks too) must not
// allocate: slots, staging, signals, fp8 scratch, message records and outputs are all reused.
// fp8 from bf16, at hidden 128 (packed per peer) and 2048 (per slot: 12 rows x 2 KiB).
int run_noalloc(transport::Communicator& comm, int64_t tokens) {
  for (const int64_t hidden : {128, 2048}) {
    const Case c = bf16_case(comm, tokens, 4, 3, hidden);
    const RankInputs in = make_inputs(c, comm.rank());
    LowLatencyBuffer buffer(comm, ll_config(c, DType::F8E4M3, int(tokens)));
    EXPECT_SAME(buffer.dispatch_packed() == (hidden == 128), "hidden %lld: dispatch %s",
                (long long)hidden, buffer.dispatch_packed() ? "packed" : "per slot");
    LowLatencyRecv recv;
    Tensor y, out;
    y.resize(DType::BF16, int64_t(buffer.num_local_experts()) * c.world_size *
                              buffer.slot_capacity(), c.hidden);
    const TensorView x{in.x.data(), DType::BF16, in.num_tokens, c.hidden};
    long before = 0;
    t_counted = true;
    for (int i = 0; i < 6; ++i) {
      if (i == 2) before = g_allocations.load();
      buffer.dispatch_send(x, in.topk_idx.data());
      buffer.dispatch_recv(recv);
      buffer.combine_send(y.view());
      buffer.combine_recv(in.topk_weights.data(), out);
      buffer.dispatch(x, in.topk_idx.data(), recv);
      buffer.combine(y.view(), nullptr, out);
    }
    t_counted = false;
    const long allocated = g_allocations.load() - before;
    EXPECT_SAME(allocated == 0, "%ld allocations in 4 steady-state rounds (hidden %lld)",
                allocated, (long long)hidden);
  }
  return 0;
}

int run_loop(transport::Communicator& comm, int64_t tokens) {
  const Case c = bf16_case(comm, tokens, 2, 2, 128);
  const RankInputs in = make_inputs(c, comm.rank());
  LowLatencyBuffer buffer(comm, ll_config(c, DType::BF16, int(tokens)));
  LowLatencyRecv recv;
  Tensor out;
  const int64_t slot_rows = int64_t(buffer.num_local_experts()) * c.world_size *
                            buffer.slot_capacity();
  std::fprintf(stderr, "rank %d: looping\n", comm.rank());
  for (;;) {
    buffer.dispatch({in.x.data(), c.dtype, in.num_tokens, c.hidden}, in.topk_idx.data(), recv);
    buffer.combine({recv.recv_x, c.dtype, slot_rows, c.hidden}, in.topk_weights.data(), out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const transport::Config config = transport::Config::from_env();
    g_rank = config.rank;
    MOERL_CHECK_INPUT(argc >= 2, "usage: ep_ll_test_rank ll|loop ...");
    const std::string mode = argv[1];
    transport::Communicator comm(config);
    if (mode == "loop" && argc == 3) return run_loop(comm, std::atoll(argv[2]));
    if (mode == "noalloc" && argc == 3) return run_noalloc(comm, std::atoll(argv[2]));
    MOERL_CHECK_INPUT(mode == "ll" && argc == 13, "bad arguments for mode ", mode);
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
    return run_ll(comm, c, ll_config(c, c.dtype, std::atoi(argv[10]), std::atoi(argv[11])),
                  std::string(argv[12]) == "overlap");
  } catch (const moerl::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return e.kind() == moerl::ErrorKind::BadInput ? 2 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    return 3;
  }
}
