// rollout_bench_mpi: the MPI_Alltoallv baseline of bench/rollout_throughput. It decodes the
// same rollout as `moe_generate --chunk-size <num-prompts>` (same prompts, seeds, sampler and
// model code, experts sharded E/R per rank, samples split contiguously across ranks), but
// each MoE layer's exchange is Megatron-LM's alltoall token dispatcher, as ep_bench_mpi does
// for training:
//   dispatch: permute (one row per (token, expert) pair, grouped by expert, hence by rank)
//             -> MPI_Alltoall of per-expert counts -> MPI_Alltoallv of the rows
//             -> sort the received chunks by local expert (source-major -> expert-major)
//   combine:  unsort -> MPI_Alltoallv back -> unpermute: out[t] = sum_k w[t,k] y[pair (t,k)]
// The one binary of the rollout path linked with MPI; launched through mpirun. Rank 0 prints
// moe_generate's final line (new tokens, generate_seconds, experts_seconds, ep_seconds).
//
//   mpirun -n 2 rollout_bench_mpi --checkpoint DIR --task add [--num-prompts 64 --samples 1
//          --seed 0 --max-new-tokens 64 --ignore-eos --temperature 1 --top-p 1]
#include <mpi.h>

#include <CLI/CLI.hpp>  // flags and --help

#include <algorithm>  // std::copy_n
#include <chrono>     // steady_clock
#include <cstdio>     // std::printf
#include <exception>

#include "io/checkpoint.h"
#include "model/moe_decode.h"
#include "model/sampler.h"
#include "tasks/tasks.h"
#include "tasks/tokenizer.h"
#include "tools/moe_cli.h"  // run_with_cpu_blas_kernels

namespace moerl::tools {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class MpiMoeDecode : public model::MoeDecode {
 public:
  explicit MpiMoeDecode(int world) : R_(world) {}

  void forward(float* out, const float* inp, int n, const model::ModelConfig& cfg,
               const model::LayerWeights& lw) override {
    const int C = cfg.dim, K = cfg.top_k, E = cfg.num_experts, L = E / R_;
    auto t0 = std::chrono::steady_clock::now();
    model::moe_route(inp, n, cfg, lw, acts_);  // topk_idx, topk_w [n,K]
    times.experts += seconds_since(t0);

    // ---- dispatch
    t0 = std::chrono::steady_clock::now();
    const int P = n * K;  // pairs sent
    std::vector<int> per_expert(E, 0);  // [E] pairs for each global expert
    for (int j = 0; j < P; j++) per_expert[acts_.topk_idx[j]]++;
    std::vector<int> start(E + 1, 0);
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + per_expert[e];
    row_of_pair_.resize(P);  // [n*K] row of pair (t,k) in permuted
    permuted_.resize((size_t)P * C);
    {
      std::vector<int> fill(start.begin(), start.end() - 1);
      for (int j = 0; j < P; j++) {
        const int row = fill[acts_.topk_idx[j]]++;
        row_of_pair_[j] = row;
        std::copy_n(inp + (size_t)(j / K) * C, C, permuted_.data() + (size_t)row * C);
      }
    }
    recv_per_expert_.resize((size_t)R_ * L);  // [source, local expert]
    MPI_Alltoall(per_expert.data(), L, MPI_INT, recv_per_expert_.data(), L, MPI_INT,
                 MPI_COMM_WORLD);
    send_counts_.assign(R_, 0);
    send_displs_.assign(R_, 0);
    recv_counts_.assign(R_, 0);
    recv_displs_.assign(R_, 0);
    int in = 0;
    for (int r = 0; r < R_; r++) {
      send_displs_[r] = start[r * L] * C;
      send_counts_[r] = (start[(r + 1) * L] - start[r * L]) * C;
      recv_displs_[r] = in * C;
      for (int l = 0; l < L; l++) in += recv_per_expert_[(size_t)r * L + l];
      recv_counts_[r] = in * C - recv_displs_[r];
    }
    received_.resize((size_t)in * C);
    MPI_Alltoallv(permuted_.data(), send_counts_.data(), send_displs_.data(), MPI_FLOAT,
                  received_.data(), recv_counts_.data(), recv_displs_.data(), MPI_FLOAT,
                  MPI_COMM_WORLD);
    // source-major -> expert-major: expert l's rows from sources 0..R-1, then l+1's
    xin_.resize((size_t)in * C);
    offsets_.assign(L + 1, 0);
    sorted_src_.resize((size_t)R_ * L);  // [source, local expert] first received row
    for (int r = 0; r < R_; r++)
      for (int l = 0, row = recv_displs_[r] / C; l < L; l++) {
        sorted_src_[(size_t)r * L + l] = row;
        row += recv_per_expert_[(size_t)r * L + l];
      }
    for (int l = 0, out_row = 0; l < L; l++) {
      for (int r = 0; r < R_; r++) {
        const int m = recv_per_expert_[(size_t)r * L + l];
        std::copy_n(received_.data() + (size_t)sorted_src_[(size_t)r * L + l] * C, (size_t)m * C,
                    xin_.data() + (size_t)out_row * C);
        out_row += m;
      }
      offsets_[l + 1] = out_row;
    }
    times.ep += seconds_since(t0);

    // ---- experts
    t0 = std::chrono::steady_clock::now();
    y_.resize(xin_.size());
    model::experts_forward(y_.data(), xin_.data(), offsets_.data(), L, cfg, lw, mlp_acts_);
    times.experts += seconds_since(t0);

    // ---- combine
    t0 = std::chrono::steady_clock::now();
    for (int l = 0, src_row = 0; l < L; l++)  // unsort: expert-major -> source-major
      for (int r = 0; r < R_; r++) {
        const int m = recv_per_expert_[(size_t)r * L + l];
        std::copy_n(y_.data() + (size_t)src_row * C, (size_t)m * C,
                    received_.data() + (size_t)sorted_src_[(size_t)r * L + l] * C);
        src_row += m;
      }
    MPI_Alltoallv(received_.data(), recv_counts_.data(), recv_displs_.data(), MPI_FLOAT,
                  permuted_.data(), send_counts_.data(), send_displs_.data(), MPI_FLOAT,
                  MPI_COMM_WORLD);
    for (int t = 0; t < n; t++) {  // unpermute in top-k order, fp32
      float* o = out + (size_t)t * C;
      std::fill(o, o + C, 0.0f);
      for (int k = 0; k < K; k++) {
        const float w = acts_.topk_w[(size_t)t * K + k];
        const float* y = permuted_.data() + (size_t)row_of_pair_[(size_t)t * K + k] * C;
        for (int c = 0; c < C; c++) o[c] += w * y[c];
      }
    }
    times.ep += seconds_since(t0);
  }

  bool any(bool active) override {
    auto t0 = std::chrono::steady_clock::now();
    int v = active ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    times.ep += seconds_since(t0);
    return v != 0;
  }
  const char* name() const override { return "mpi"; }

 private:
  int R_;  // ranks
  model::MoeActs acts_;
  std::vector<int> row_of_pair_, recv_per_expert_, sorted_src_;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<int64_t> offsets_;
  std::vector<float> permuted_, received_, xin_, y_;
  model::MlpActs mlp_acts_;
};

struct Options {
  std::string checkpoint, task;
  uint64_t seed = 0;
  int64_t num_prompts = 64, samples = 1;
  bool ignore_eos = false;
  model::SampleParams sp;
};

void run(const Options& o, int rank, int R) {
  tasks::check_task(o.task);
  model::SampleParams sp = o.sp;
  sp.eos_ids = o.ignore_eos ? std::vector<int32_t>{} : std::vector<int32_t>{tasks::kEos};
  model::ModelConfig cfg = io::read_checkpoint_config(o.checkpoint);
  MOERL_CHECK_INPUT(cfg.num_experts % R == 0, "num_experts ", cfg.num_experts,
                    " must be divisible by the MPI world size ", R);
  const int L = cfg.num_experts / R;
  model::ParamStore ps(model::make_layout(cfg, rank * L, L));
  io::load_weights(o.checkpoint, ps);
  // the requests of moe_generate's chunk 0 (iteration 0), this rank's contiguous share
  std::vector<model::SampleRequest> reqs;
  for (int64_t p = 0; p < o.num_prompts; p++) {
    tasks::Prompt pr = tasks::make_prompt(o.task, tasks::Split::Train, o.seed, p);
    for (int64_t s = 0; s < o.samples; s++)
      reqs.push_back({tasks::encode(pr.text),
                      model::sample_seed(o.seed, 0, (uint64_t)pr.prompt_id, (uint64_t)s)});
  }
  const int64_t S = (int64_t)reqs.size();
  std::vector<model::SampleRequest> mine(reqs.begin() + S * rank / R,
                                         reqs.begin() + S * (rank + 1) / R);
  MpiMoeDecode moe(R);
  std::vector<model::SampleResult> res;
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  model::generate(ps, moe, mine, sp, res);
  const double s = seconds_since(t0);
  long long tokens = 0;
  for (const auto& r : res) tokens += (long long)r.tokens.size();
  MPI_Allreduce(MPI_IN_PLACE, &tokens, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("{\"done\":true,\"new_tokens\":%lld,\"ranks\":%d,\"ep_mode\":\"mpi\","
                "\"generate_seconds\":%.4f,\"experts_seconds\":%.4f,\"ep_seconds\":%.4f}\n",
                tokens, R, s, moe.times.experts, moe.times.ep);
}

}  // namespace
}  // namespace moerl::tools

int main(int argc, char** argv) {
  using namespace moerl::tools;
  run_with_cpu_blas_kernels(argv);  // the kernels moe_generate runs, before MPI starts
  MPI_Init(&argc, &argv);
  int rank = 0, R = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  CLI::App app{"MPI_Alltoallv baseline of expert-parallel rollout decode (bench only).",
               "rollout_bench_mpi"};
  Options o;
  app.add_option("--checkpoint", o.checkpoint, "policy checkpoint directory")->required();
  app.add_option("--task", o.task, "built-in task (add, sort, reverse)")->required();
  app.add_option("--num-prompts", o.num_prompts, "prompts of the rollout");
  app.add_option("--samples", o.samples, "samples per prompt");
  app.add_option("--seed", o.seed, "campaign seed (prompts and samples)");
  app.add_option("--max-new-tokens", o.sp.max_new_tokens, "tokens to generate per sample at most");
  app.add_option("--temperature", o.sp.temperature, "sampling temperature, 0 = greedy");
  app.add_option("--top-p", o.sp.top_p, "nucleus mass, in (0, 1]");
  app.add_flag("--ignore-eos", o.ignore_eos, "always generate --max-new-tokens");
  int code = 0;
  try {
    app.parse(argc, argv);
    run(o, rank, R);
  } catch (const CLI::ParseError& e) {
    code = app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rollout_bench_mpi rank %d: %s\n", rank, e.what());
    code = 1;
  }
  // a rank that failed alone would leave the others in a collective: abort them all
  if (code != 0 && code != 2) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  return code;
}
