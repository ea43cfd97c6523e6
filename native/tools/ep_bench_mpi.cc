// ep_bench_mpi: the MPI_Alltoallv baseline for ep_bench, built the way Megatron-LM's
// alltoall token dispatcher works on one host:
//   dispatch: permute (one row per (token, expert) slot, grouped by expert, hence by rank)
//             -> MPI_Alltoall of per-expert counts -> MPI_Alltoallv of the rows
//             -> sort the received chunks by local expert (source-major -> expert-major)
//   combine:  unsort (expert-major -> source-major) -> MPI_Alltoallv back
//             -> unpermute: sum each token's slots into an fp32 row, round once
// Same routing, payload, timing and byte count as ep_bench (ep_bench_common.h), so the
// GB/s figures compare times of the same useful work. Launched by ep_bench through mpirun.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "ep_bench_common.h"

using namespace moerl;
using namespace moerl::bench;

#if defined(__SANITIZE_ADDRESS__)
// In the sanitizer build: Open MPI never frees some of its own allocations (e.g. in
// ompi_op_base_op_select), which LeakSanitizer reports at exit. Those leaks are the library's,
// so this one binary turns leak detection off; everything else keeps it.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
#endif

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int R = 1, self = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &self);
  Options o;
  if (!parse_options(argc, argv, o) || o.experts % R != 0) MPI_Abort(MPI_COMM_WORLD, 2);
  o.ranks = R;
  const int64_t T = o.tokens, C = o.hidden;
  const int K = o.topk, E = o.experts, L = E / R;
  const Routing routing = make_routing(o, self);
  ep::HostBytes x;  // every large buffer on huge pages, as in ep_bench
  std::vector<float> scales;
  make_payload(o, self, x, scales);
  const ep::DType dt = payload_dtype(o), cdt = combine_dtype(o);
  const size_t row = size_t(C) * ep::dtype_bytes(dt), crow = size_t(C) * ep::dtype_bytes(cdt);
  MPI_Datatype row_type, crow_type;
  MPI_Type_contiguous(int(row), MPI_BYTE, &row_type);
  MPI_Type_contiguous(int(crow), MPI_BYTE, &crow_type);
  MPI_Type_commit(&row_type);
  MPI_Type_commit(&crow_type);

  // Routing-derived plan (fixed across iterations, as the layout is in ep_bench).
  std::vector<int> slots_per_expert(static_cast<size_t>(E), 0);
  for (auto e : routing.topk_idx) ++slots_per_expert[size_t(e)];
  std::vector<int64_t> expert_start(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e)
    expert_start[size_t(e) + 1] = expert_start[size_t(e)] + slots_per_expert[size_t(e)];
  const int64_t P = expert_start[size_t(E)];
  std::vector<int64_t> perm_token(static_cast<size_t>(P));  // permuted row -> source token
  {
    std::vector<int64_t> cur(expert_start.begin(), expert_start.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const auto e = size_t(routing.topk_idx[size_t(t * K + k)]);
        perm_token[size_t(cur[e]++)] = t;
      }
  }
  const size_t num_ranks = static_cast<size_t>(R);
  std::vector<int> send_counts(num_ranks), send_displs(num_ranks), recv_counts(num_ranks),
      recv_displs(num_ranks);
  std::vector<int> recv_per_expert(size_t(R * L));  // [source, local expert]
  ep::HostBytes permuted(size_t(P) * row), received, sorted;
  ep::HostBytes c_sorted, c_received, c_permuted(size_t(P) * crow), combined(size_t(T) * crow);
  std::vector<float, ep::HugePageAllocator<float>> acc(size_t(T * C));

  auto dispatch = [&] {
    for (int64_t i = 0; i < P; ++i)
      std::memcpy(permuted.data() + size_t(i) * row,
                  x.data() + size_t(perm_token[size_t(i)]) * row, row);
    MPI_Alltoall(slots_per_expert.data(), L, MPI_INT, recv_per_expert.data(), L, MPI_INT,
                 MPI_COMM_WORLD);
    int in = 0;
    for (int r = 0; r < R; ++r) {
      send_counts[size_t(r)] = int(expert_start[size_t((r + 1) * L)] - expert_start[size_t(r * L)]);
      send_displs[size_t(r)] = int(expert_start[size_t(r * L)]);
      recv_counts[size_t(r)] = 0;
      for (int l = 0; l < L; ++l) recv_counts[size_t(r)] += recv_per_expert[size_t(r * L + l)];
      recv_displs[size_t(r)] = in;
      in += recv_counts[size_t(r)];
    }
    received.resize(size_t(in) * row);
    sorted.resize(size_t(in) * row);
    MPI_Alltoallv(permuted.data(), send_counts.data(), send_displs.data(), row_type, received.data(),
                  recv_counts.data(), recv_displs.data(), row_type, MPI_COMM_WORLD);
    // Source-major -> expert-major.
    size_t out = 0;
    for (int l = 0; l < L; ++l) {
      for (int r = 0; r < R; ++r) {
        int64_t src = recv_displs[size_t(r)];
        for (int j = 0; j < l; ++j) src += recv_per_expert[size_t(r * L + j)];
        const size_t n = size_t(recv_per_expert[size_t(r * L + l)]) * row;
        std::memcpy(sorted.data() + out, received.data() + size_t(src) * row, n);
        out += n;
      }
    }
  };
  auto combine = [&] {
    // y: the expert outputs, expert-major, in the combine dtype (contents do not matter).
    const size_t in = sorted.size() / row;
    c_sorted.resize(in * crow);
    c_received.resize(in * crow);
    size_t pos = 0;
    for (int l = 0; l < L; ++l) {
      for (int r = 0; r < R; ++r) {
        int64_t dst = recv_displs[size_t(r)];
        for (int j = 0; j < l; ++j) dst += recv_per_expert[size_t(r * L + j)];
        const size_t n = size_t(recv_per_expert[size_t(r * L + l)]) * crow;
        std::memcpy(c_received.data() + size_t(dst) * crow, c_sorted.data() + pos, n);
        pos += n;
      }
    }
    MPI_Alltoallv(c_received.data(), recv_counts.data(), recv_displs.data(), crow_type, c_permuted.data(),
                  send_counts.data(), send_displs.data(), crow_type, MPI_COMM_WORLD);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t i = 0; i < P; ++i) {
      float* a = acc.data() + perm_token[size_t(i)] * C;
      if (cdt == ep::DType::F32) {
        const auto* v = reinterpret_cast<const float*>(c_permuted.data() + size_t(i) * crow);
        for (int64_t c = 0; c < C; ++c) a[c] += v[c];
      } else {
        const auto* v = reinterpret_cast<const uint16_t*>(c_permuted.data() + size_t(i) * crow);
        for (int64_t c = 0; c < C; ++c) a[c] += ep::bf16_to_f32(v[c]);
      }
    }
    for (int64_t i = 0; i < T * C; ++i) {
      if (cdt == ep::DType::F32) reinterpret_cast<float*>(combined.data())[i] = acc[size_t(i)];
      else reinterpret_cast<uint16_t*>(combined.data())[i] = ep::f32_to_bf16(acc[size_t(i)]);
    }
  };

  for (int i = 0; i < o.warmup + 1; ++i) {
    dispatch();
    combine();
  }
  const int I = o.iters;
  std::vector<double> td(size_t(R * I), 0.0), tc(size_t(R * I), 0.0);
  for (int i = 0; i < I; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    dispatch();
    td[size_t(self * I + i)] = MPI_Wtime() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    combine();
    tc[size_t(self * I + i)] = MPI_Wtime() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, td.data(), R * I, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, tc.data(), R * I, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  // Useful bytes as ep_bench counts them: this rank's unique (token, destination) rows
  // received; gather every source's rows to every destination.
  std::vector<double> rows_to(static_cast<size_t>(R));
  for (int d = 0; d < R; ++d) rows_to[size_t(d)] = double(unique_rows_to(routing, o, d));
  MPI_Allreduce(MPI_IN_PLACE, rows_to.data(), R, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (self == 0) {
    double total_rows = 0;
    for (double r : rows_to) total_rows += r;
    const double bytes_d = total_rows / R * double(row), bytes_c = total_rows / R * double(crow);
    const double d = median_of_max(td, R, I), c = median_of_max(tc, R, I);
    std::printf("{\"mpi_dispatch_us\": %.1f, \"mpi_combine_us\": %.1f, \"mpi_dispatch_gbps\": %.4f, "
                "\"mpi_combine_gbps\": %.4f}\n", d * 1e6, c * 1e6, bytes_d / d / 1e9, bytes_c / c / 1e9);
  }
  MPI_Type_free(&row_type);
  MPI_Type_free(&crow_type);
  MPI_Finalize();
  return 0;
}
