// The MoE block of an expert-parallel decode step, behind one small interface so that the
// sampler (sampler.h) runs the same decode loop over three exchanges: the low-latency buffer
// (ep/low_latency.h, the rollout default on R > 1 ranks), the normal mode (ExpertComm, what
// one rank has always used) and, in the benchmark only, an MPI_Alltoallv baseline
// (tools/rollout_bench_mpi.cc, the one binary linked with MPI).
//
// Dimensions: R ranks, E experts (rank r holds [r*L, (r+1)*L)), L = E/R, n rows (this rank's
// active sequences at this step), C channels, K top-k, F expert hidden size.
// Every method is collective: all ranks call forward() once per layer and any() once per step,
// in the same order, also a rank whose sequences are all finished (n = 0).
#pragma once

#include <cstdint>
#include <limits>  // std::numeric_limits: the normal mode's row bound
#include <memory>  // std::unique_ptr for the low-latency buffer
#include <vector>

#include "ep/low_latency.h"
#include "model/config.h"
#include "model/expert_comm.h"
#include "model/moe.h"
#include "model/weights.h"
#include "transport/communicator.h"

namespace moerl::model {

// Seconds spent on this rank, summed over calls: where a decode step's MoE time goes.
struct DecodeTimes {
  double experts = 0.0;  // router, top-k, grouping rows by expert, the experts' GEMMs
  double ep = 0.0;       // dispatch + combine + the per-step any() (includes waiting for
                         //   the slowest rank)
};

class MoeDecode {
 public:
  virtual ~MoeDecode() = default;
  // out [n,C] = MoE(inp [n,C]) with the layer's router and this rank's experts of lw.
  virtual void forward(float* out, const float* inp, int n, const ModelConfig& cfg,
                       const LayerWeights& lw) = 0;
  // True when `active` is true on any rank: every rank leaves the decode loop at one step.
  virtual bool any(bool active) = 0;
  // The most rows forward() takes in one call (the sampler's rows per step).
  virtual int max_rows() const { return std::numeric_limits<int>::max(); }
  virtual const char* name() const = 0;  // "ll", "normal", "mpi": for logs and bench lines
  DecodeTimes times;
};

// Normal mode: moe_forward through ExpertComm (ep::Buffer: layout, dispatch, combine).
// On one rank this is exactly the computation the sampler has always done.
class NormalMoeDecode : public MoeDecode {
 public:
  explicit NormalMoeDecode(ExpertComm& comm) : comm_(comm) {}
  void forward(float* out, const float* inp, int n, const ModelConfig& cfg,
               const LayerWeights& lw) override;
  bool any(bool active) override;
  const char* name() const override { return "normal"; }

 private:
  ExpertComm& comm_;
  MoeActs acts_;
};

// Low-latency mode: one dispatch + combine of the LowLatencyBuffer per layer, fp32 on the
// wire; a token's K expert outputs are reduced in top-k order 0..K-1 (fp32, one rounding),
// so the result does not depend on R or on which rank holds which sequence.
class LowLatencyMoeDecode : public MoeDecode {
 public:
  // max_rows: the most rows (sequences) any rank passes to one forward(), the same on all
  // ranks (it sizes the receive slots).
  LowLatencyMoeDecode(transport::Communicator& comm, const ModelConfig& cfg, int max_rows);
  void forward(float* out, const float* inp, int n, const ModelConfig& cfg,
               const LayerWeights& lw) override;
  bool any(bool active) override;
  int max_rows() const override { return max_rows_; }
  const char* name() const override { return "ll"; }
  const char* transport_path() const { return buffer_->transport_path(); }

 private:
  transport::Communicator& comm_;
  int max_rows_;
  std::unique_ptr<ep::LowLatencyBuffer> buffer_;
  MoeActs acts_;
  std::vector<ep::topk_idx_t> idx64_;  // [n,K]
  ep::LowLatencyRecv recv_;
  std::vector<int64_t> offsets_;       // [L+1] grouped rows per local expert
  std::vector<float> xin_, y_;         // [Nr,C] grouped by expert
  std::vector<float> slot_y_;          // [L, R*P, C] expert outputs in the slot layout
  MlpActs mlp_acts_;                   // one expert's scratch
  ep::Tensor combined_;                // [n,C]
};

// y [P,C] = W2_e (silu(W1_e x) * W3_e x) for rows [offsets[e], offsets[e+1]) of x [P,C], for
// each local expert e of lw; scratch holds one expert's activations at a time.
void experts_forward(float* y, const float* x, const int64_t* offsets, int num_local_experts,
                     const ModelConfig& cfg, const LayerWeights& lw, MlpActs& scratch);

}  // namespace moerl::model
