// One optimizer step of SFT or GRPO over a global minibatch of sequences, expert parallel:
// every rank reads the same minibatch and takes sequences i with i % R == rank, losses are
// normalised by global counts, dense gradients are allreduced and expert gradients stay on
// the expert's rank. The step is therefore the single-rank step up to summation order.
#pragma once

#include <cstdint>
#include <functional>  // std::function for progress callbacks
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/expert_comm.h"
#include "model/weights.h"
#include "rl/adamw.h"

namespace moerl::rl {

struct TrainSequence {
  std::vector<int32_t> tokens;        // prompt followed by completion
  int prompt_len = 0;                 // loss on positions predicting tokens[prompt_len..]
  std::vector<float> old_logprobs;    // [completion] behaviour log-probs (GRPO)
  std::vector<float> ref_logprobs;    // [completion] reference log-probs (GRPO with KL)
  // [completion] this trainer's log-probs at the sequence's first forward of the update (GRPO):
  // the old policy of truncated importance sampling and of mismatch_kl. Filled by that forward.
  std::vector<float> train_logprobs;
  float advantage = 0.0f;             // GRPO, per sequence
  // [completion] 1 where the token is the policy's own and trained, 0 where an environment
  // wrote it (a tool result, an observation: no loss, no logits computed); empty = all trained.
  // Masked positions hold 0 in train_logprobs and ref_logprobs.
  std::vector<uint8_t> loss_mask;
  bool trained(int j) const { return loss_mask.empty() || loss_mask[j] != 0; }
};

enum class Objective { Sft, Grpo };

// The policy term of each completion token (docs/algorithms.md gives each formula): the
// clipped ratio of PPO and GRPO, GSPO's clipped sequence ratio (GSPO-token: every token of a
// sequence has its value and the gradient of log p(token) times it), CISPO's detached clipped
// ratio weighing log p(token).
enum class PolicyLoss { PpoClip, Gspo, Cispo };
// How token losses make the step's loss, by verl's names: token-mean (every trained token of the
// minibatch alike), seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm (the
// token sum over a constant, Dr.GRPO's): the mean over sequences with a trained token.
enum class Aggregation { TokenMean, SeqMeanTokenSum, SeqMeanTokenMean, SeqMeanTokenSumNorm };
// Estimators of KL(policy || reference) from d = log p_ref - log p on sampled tokens (Schulman's
// k1 = -d, k2 = d^2 / 2, k3 = e^d - d - 1).
enum class KlEstimator { K1, K2, K3 };

struct LossConfig {
  Objective objective = Objective::Sft;
  PolicyLoss policy_loss = PolicyLoss::PpoClip;
  Aggregation aggregation = Aggregation::TokenMean;
  KlEstimator kl_estimator = KlEstimator::K3;
  float clip_eps = 0.2f;      // ratio clip below: 1 - clip_eps
  float clip_high = 0.2f;     // ratio clip above: 1 + clip_high (DAPO's clip-higher)
  float norm_tokens = 0.0f;   // seq-mean-token-sum-norm's constant, > 0 there
  float kl_coef = 0.0f;       // KL to the reference policy, in the loss
  float entropy_coef = 0.0f;  // bonus: loss -= entropy_coef * mean entropy
  float aux_coef = 0.01f;     // balance loss weight (the model's BalanceLoss says how it counts)
  float z_coef = 0.001f;      // router z-loss, mean over all tokens (prompt too) and layers
  float temperature = 1.0f;   // log-probs of softmax(logits / temperature), as the sampler
  float tis_clip = 0.0f;      // truncated importance sampling cap C (GRPO); 0 = off
  int micro_batch = 32;       // sequences per forward/backward on one rank
};

struct StepMetrics {
  double loss = 0, policy_loss = 0, kl = 0, entropy = 0, clip_frac = 0, aux_loss = 0, z_loss = 0;
  double mismatch_kl = 0, tis_clip_frac = 0;  // GRPO: rollout vs trainer log-probs
  double tokens = 0, sequences = 0, grad_norm = 0, lr = 0;
  double seconds = 0, compute_seconds = 0, flops = 0, ep_seconds = 0, ep_bytes = 0;
  std::vector<double> expert_load;  // [E] fraction of (token, slot) picks per expert
  std::vector<std::vector<double>> expert_load_layers;  // [L][E] the same, per layer
  std::string to_json(int64_t step) const;
};

// One completion token of the GRPO loss on its row of logits [V]: returns its terms and, if
// dlogits is non-null, writes scale * d(loss)/d(logits) into dlogits [V], which may be logits
// itself (the row becomes its gradient). old_logprob is the rollout's log-prob; train_logprob
// the trainer's at the token's first forward, or null in that forward (its own log-prob,
// rounded to float32, is used).
// seq_log_ratio (GSPO only): the mean over the sequence's trained tokens of log p - log p_old,
// p_old the trainer's old policy with TIS and the rollout's without.
struct GrpoTokenTerms {
  double loss = 0, policy = 0, kl = 0, entropy = 0;
  double logprob = 0;      // log p(target) under softmax(logits / temperature)
  double mismatch_kl = 0;  // k3 of KL(rollout || trainer) on this token
  bool clipped = false;  // PPO, GSPO: no policy gradient; CISPO: the weight is clipped
  bool tis_clipped = false;  // the importance weight is truncated at lc.tis_clip
};
GrpoTokenTerms grpo_token(const float* logits, int V, int target, float old_logprob,
                          const float* train_logprob, float ref_logprob, float advantage,
                          const LossConfig& lc, double scale, float* dlogits,
                          double seq_log_ratio = 0.0);

// Called after each of this rank's micro-batches (done of total; every rank runs the same
// number), so a tool can report progress inside a long step. Must not throw.
using MicroBatchProgress = std::function<void(int done, int total)>;

// Forward/backward over `batch` (global; this rank uses its share): gradients of the step's
// loss in ps.dw (dense ones summed over ranks) and the step's metrics but grad_norm and lr.
// GRPO: fills train_logprobs of this rank's sequences that have none.
StepMetrics compute_gradients(model::ParamStore& ps, model::ExpertComm& comm,
                              std::vector<TrainSequence>& batch, const LossConfig& lc,
                              const MicroBatchProgress& progress = nullptr);

// compute_gradients, then one AdamW step.
StepMetrics train_step(model::ParamStore& ps, io::OptimizerState& opt, model::ExpertComm& comm,
                       std::vector<TrainSequence>& batch, const LossConfig& lc,
                       const AdamWConfig& ac, const MicroBatchProgress& progress = nullptr);

// Per-token log-probs of each sequence's completion under `ps` (e.g. the reference policy),
// written to seq.ref_logprobs for this rank's share; collective like train_step.
void fill_ref_logprobs(model::ParamStore& ps, model::ExpertComm& comm,
                       std::vector<TrainSequence>& batch, const LossConfig& lc,
                       const MicroBatchProgress& progress = nullptr);

// The estimator's KL of one token from d = log p_ref - log p, and its derivative in log p.
double kl_value(double d, KlEstimator estimator);
double kl_gradient(double d, KlEstimator estimator);

// The KL as a reward penalty (docs/algorithms.md): Σ over the trained tokens of kl_value at
// d = ref_logprobs - old_logprobs, the behaviour policy's distance from the reference.
double sequence_kl(const TrainSequence& s, KlEstimator estimator);

}  // namespace moerl::rl
