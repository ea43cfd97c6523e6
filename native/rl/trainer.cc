// SFT and GRPO steps: micro-batching, per-token loss gradients, EP-parallel backward,
// gradient allreduce, AdamW, global metrics.
#include "rl/trainer.h"

#include <algorithm>  // std::max, std::min
#include <chrono>     // steady_clock
#include <cmath>      // std::exp
#include <sstream>    // std::ostringstream

#include "common/check.h"
#include "io/json.h"
#include "model/model.h"
#include "model/ops.h"  // softmax_stats, logsoftmax_backward

namespace moerl::rl {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This rank's share: sequences i with i % R == rank, then split into micro-batches. Every
// rank runs the same number of micro-batches (possibly empty) because each forward and
// backward is collective.
std::vector<std::vector<int>> micro_batches(int n, int rank, int R, int mb) {
  std::vector<int> mine;
  for (int i = rank; i < n; i += R) mine.push_back(i);
  int max_share = (n + R - 1) / R;
  int count = std::max(1, (max_share + mb - 1) / mb);
  std::vector<std::vector<int>> out(count);
  for (size_t j = 0; j < mine.size(); j++) out[j / mb].push_back(mine[j]);
  return out;
}

struct Packed {
  int B = 0, T = 1;
  std::vector<int32_t> tokens, lengths;
};

Packed pack(const std::vector<TrainSequence>& batch, const std::vector<int>& ids, int max_len) {
  Packed p;
  p.B = (int)ids.size();
  for (int i : ids) p.T = std::max(p.T, (int)batch[i].tokens.size());
  MOERL_CHECK_INPUT(p.T <= max_len, "sequence of ", p.T, " tokens exceeds max_seq_len ", max_len);
  p.tokens.assign((size_t)p.B * p.T, 0);
  for (int b = 0; b < p.B; b++) {
    const TrainSequence& s = batch[ids[b]];
    std::copy(s.tokens.begin(), s.tokens.end(), p.tokens.begin() + (size_t)b * p.T);
    p.lengths.push_back((int32_t)s.tokens.size());
  }
  return p;
}

// The rows of a packed micro-batch whose logits a loss reads: positions prompt_len - 1 ..
// len - 2 of each sequence (each predicts the next token) whose target is trained, sequence by
// sequence.
std::vector<int32_t> loss_rows(const std::vector<TrainSequence>& batch, const std::vector<int>& ids,
                               int T) {
  std::vector<int32_t> rows;
  for (size_t b = 0; b < ids.size(); b++) {
    const TrainSequence& s = batch[ids[b]];
    for (int t = s.prompt_len - 1; t + 1 < (int)s.tokens.size(); t++)
      if (s.trained(t + 1 - s.prompt_len)) rows.push_back((int32_t)(b * T + t));
  }
  return rows;
}

// Trained tokens of a sequence: its completion less the masked positions.
int trained_tokens(const TrainSequence& s) {
  const int n = (int)s.tokens.size() - s.prompt_len;
  if (s.loss_mask.empty()) return n;
  int k = 0;
  for (uint8_t m : s.loss_mask) k += m != 0;
  return k;
}

// The weight of each of a sequence's token losses in the step's loss (lc.aggregation), given
// the minibatch's trained tokens and its sequences with at least one.
double sequence_weight(const LossConfig& lc, int trained, double n_tok, double n_seq) {
  switch (lc.aggregation) {
    case Aggregation::TokenMean: return 1.0 / n_tok;
    case Aggregation::SeqMeanTokenSum: return 1.0 / n_seq;
    case Aggregation::SeqMeanTokenMean: return trained > 0 ? 1.0 / (n_seq * trained) : 0.0;
    case Aggregation::SeqMeanTokenSumNorm: return 1.0 / (n_seq * lc.norm_tokens);
  }
  return 0.0;
}

// GSPO's log sequence ratio: the mean over the sequence's trained tokens of log p - log p_old
// (seq_log_ratio of grpo_token), from its rows of logits [trained, V] before they become
// gradients. A first forward with TIS has p_old = p: 0.
double gspo_log_ratio(const float* rows, int V, const TrainSequence& s, const LossConfig& lc,
                      bool first) {
  if (first && lc.tis_clip > 0.0f) return 0.0;
  const float inv_tau = 1.0f / lc.temperature;
  double sum = 0.0;
  int k = 0;
  for (int t = s.prompt_len - 1; t + 1 < (int)s.tokens.size(); t++) {
    const int j = t + 1 - s.prompt_len;
    if (!s.trained(j)) continue;
    const model::SoftmaxStats st = model::softmax_stats(rows, V, inv_tau, false);
    const double lp = st.logprob(rows, s.tokens[t + 1], inv_tau);
    sum += lp - (lc.tis_clip > 0.0f ? (double)s.train_logprobs[j] : (double)s.old_logprobs[j]);
    rows += V;
    k++;
  }
  return k > 0 ? sum / k : 0.0;
}

void check_sequence(const TrainSequence& s, Objective obj, int i) {
  MOERL_CHECK_INPUT(s.prompt_len >= 1 && s.prompt_len < (int)s.tokens.size(), "sequence ", i,
                    ": prompt length ", s.prompt_len, " must be in [1, ", s.tokens.size(), ")");
  MOERL_CHECK_INPUT(s.loss_mask.empty() || s.loss_mask.size() == s.tokens.size() - s.prompt_len,
                    "sequence ", i, ": loss mask of ", s.loss_mask.size(), " entries for ",
                    s.tokens.size() - s.prompt_len, " completion tokens");
  if (obj == Objective::Grpo) {
    MOERL_CHECK_INPUT(s.old_logprobs.size() == s.tokens.size() - s.prompt_len, "sequence ", i,
                      ": ", s.old_logprobs.size(), " behaviour log-probs for ",
                      s.tokens.size() - s.prompt_len, " completion tokens");
    MOERL_CHECK(s.train_logprobs.empty() || s.train_logprobs.size() == s.old_logprobs.size(),
                "sequence ", i, ": ", s.train_logprobs.size(), " trainer log-probs for ",
                s.old_logprobs.size(), " completion tokens");
  }
}

}  // namespace

GrpoTokenTerms grpo_token(const float* logits, int V, int target, float old_logprob,
                          const float* train_logprob, float ref_logprob, float advantage,
                          const LossConfig& lc, double scale, float* dlogits,
                          double seq_log_ratio) {
  GrpoTokenTerms t;
  const float inv_tau = 1.0f / lc.temperature;
  const model::SoftmaxStats st = model::softmax_stats(logits, V, inv_tau, true);
  const double lp = st.logprob(logits, target, inv_tau);
  t.logprob = lp;
  const float train_lp = train_logprob != nullptr ? *train_logprob : (float)lp;
  // k3 with r = p_train / p_rollout over tokens the rollout sampled: expm1 keeps its rounding
  // (the native/native mismatch) visible
  const double d_mis = (double)train_lp - old_logprob;
  t.mismatch_kl = std::expm1(d_mis) - d_mis;
  // truncated importance sampling: the ratio is taken to the trainer's old log-prob and the
  // rollout's enters only through the detached weight w
  double w = 1.0, old_lp = old_logprob;
  if (lc.tis_clip > 0.0f) {
    const double raw = std::exp(d_mis);
    t.tis_clipped = raw > lc.tis_clip;
    w = std::min(raw, (double)lc.tis_clip);
    old_lp = train_lp;
  }
  const double A = advantage;
  const double lo = 1.0 - lc.clip_eps, hi = 1.0 + lc.clip_high;
  double g_lp = 0.0;  // d policy / d logp
  if (lc.policy_loss == PolicyLoss::Cispo) {
    // -w sg(clip(r)) A logp: every token keeps a gradient, its weight bounded
    const double ratio = std::exp(lp - old_lp);
    const double weight = std::min(std::max(ratio, lo), hi);
    t.clipped = weight != ratio;
    t.policy = -w * weight * A * lp;
    g_lp = -w * weight * A;
  } else {
    // PPO's pessimistic clip of the token ratio, or of the sequence's (GSPO), whose value each
    // token of the sequence carries with d ratio / d logp = ratio
    const double ratio = lc.policy_loss == PolicyLoss::Gspo ? std::exp(seq_log_ratio)
                                                            : std::exp(lp - old_lp);
    const double clipped = std::min(std::max(ratio, lo), hi);
    t.clipped = ratio * A > clipped * A;
    t.policy = -w * std::min(ratio * A, clipped * A);
    g_lp = t.clipped ? 0.0 : -w * A * ratio;
  }
  if (lc.kl_coef != 0.0f) {
    const double d = ref_logprob - lp;  // log p_ref / p
    t.kl = kl_value(d, lc.kl_estimator);
    g_lp += lc.kl_coef * kl_gradient(d, lc.kl_estimator);
  }
  t.entropy = st.entropy;
  t.loss = t.policy + lc.kl_coef * t.kl - lc.entropy_coef * st.entropy;
  if (dlogits != nullptr)
    model::logsoftmax_backward(dlogits, logits, V, inv_tau, st, target, g_lp, -lc.entropy_coef,
                               scale);
  return t;
}

StepMetrics compute_gradients(model::ParamStore& ps, model::ExpertComm& comm,
                              std::vector<TrainSequence>& batch, const LossConfig& lc,
                              const MicroBatchProgress& progress) {
  const model::ModelConfig& cfg = ps.layout.cfg;
  const int V = cfg.vocab_size, E = cfg.num_experts, L = cfg.num_layers;
  const double t0 = now_s();
  const double ep_s0 = comm.stats.seconds;
  const uint64_t ep_b0 = comm.stats.bytes;
  MOERL_CHECK_INPUT(!batch.empty(), "training batch is empty");

  // Global normalisers, known to every rank without communication.
  double n_tok = 0.0, n_valid = 0.0, n_trained_seq = 0.0;
  for (size_t i = 0; i < batch.size(); i++) {
    check_sequence(batch[i], lc.objective, (int)i);
    const int k = trained_tokens(batch[i]);
    n_tok += k;
    n_trained_seq += k > 0;
    n_valid += batch[i].tokens.size();
  }
  MOERL_CHECK_INPUT(n_tok > 0, "training batch of ", batch.size(),
                    " sequences has no trained token (every completion token is masked)");
  MOERL_CHECK_INPUT(lc.aggregation != Aggregation::SeqMeanTokenSumNorm || lc.norm_tokens > 0.0f,
                    "seq-mean-token-sum-norm needs a norm token count > 0");
  const double n_seq = (double)batch.size();
  const int L_moe = model::num_moe_layers(cfg);
  const std::vector<std::vector<int>> mbs =
      micro_batches((int)batch.size(), comm.rank(), comm.world_size(), lc.micro_batch);
  // The balance loss: sequence-wise, a mean over sequences and MoE layers; batch-wise
  // (transformers' definition), one loss per micro-batch of all ranks, a mean over micro-batches.
  const bool batch_balance = cfg.balance_loss == model::BalanceLoss::Batch;
  const double aux_norm = batch_balance ? (double)mbs.size() : n_seq * L_moe;
  const float aux_weight = (float)(lc.aux_coef / aux_norm);
  const float z_weight = (float)(lc.z_coef / (n_valid * L_moe));

  // metric accumulators, summed over ranks at the end
  enum { kLoss, kPolicy, kKl, kEntropy, kClip, kMismatch, kTisClip, kAux, kZ, kFlops, kNum };
  // [kNum, kNum + E): expert picks over all layers; then L blocks of E, one per layer
  std::vector<float> acc(kNum + E + (size_t)L * E, 0.0f);

  ps.zero_grad();
  model::Activations a;
  for (size_t mb = 0; mb < mbs.size(); mb++) {
    const std::vector<int>& ids = mbs[mb];
    Packed pk = pack(batch, ids, cfg.max_seq_len);
    const std::vector<int32_t> rows = loss_rows(batch, ids, pk.T);
    model::model_forward(ps, comm, pk.tokens.data(), pk.lengths.data(), pk.B, pk.T, a, &rows);
    // each row of a.logits becomes its gradient in place: model_backward reads it as dlogits
    float* lg = a.logits.data();
    for (int b = 0; b < pk.B; b++) {
      TrainSequence& s = batch[ids[b]];
      // the sequence's first forward of the update: its log-probs become the trainer's old ones
      const bool first = lc.objective == Objective::Grpo && s.train_logprobs.empty();
      acc[kFlops] += (float)(3.0 * model::forward_flops(cfg, 1, (int)s.tokens.size()));
      MOERL_CHECK(lc.objective == Objective::Sft || lc.kl_coef == 0.0f ||
                      s.ref_logprobs.size() == s.old_logprobs.size(),
                  "sequence ", ids[b], " has no reference log-probs (fill_ref_logprobs first)");
      const double weight = lc.objective == Objective::Sft
                                ? 1.0 / n_tok
                                : sequence_weight(lc, trained_tokens(s), n_tok, n_trained_seq);
      const double seq_log_ratio = lc.policy_loss == PolicyLoss::Gspo
                                       ? gspo_log_ratio(lg, V, s, lc, first)
                                       : 0.0;
      for (int t = s.prompt_len - 1; t + 1 < (int)s.tokens.size(); t++) {
        const int target = s.tokens[t + 1];
        const int j = t + 1 - s.prompt_len;
        if (!s.trained(j)) {
          if (first) s.train_logprobs.push_back(0.0f);
          continue;  // no row of logits: loss_rows left it out
        }
        float* const row = lg;
        lg += V;
        if (lc.objective == Objective::Sft) {
          const model::SoftmaxStats st = model::softmax_stats(row, V, 1.0f, true);
          acc[kLoss] += (float)(-st.logprob(row, target, 1.0f) * weight);
          acc[kEntropy] += (float)st.entropy;
          model::logsoftmax_backward(row, row, V, 1.0f, st, target, -1.0, 0.0, weight);
          continue;
        }
        const float ref_lp = lc.kl_coef != 0.0f ? s.ref_logprobs[j] : 0.0f;
        GrpoTokenTerms tt =
            grpo_token(row, V, target, s.old_logprobs[j], first ? nullptr : &s.train_logprobs[j],
                       ref_lp, s.advantage, lc, weight, row, seq_log_ratio);
        if (first) s.train_logprobs.push_back((float)tt.logprob);
        acc[kPolicy] += (float)tt.policy;
        acc[kKl] += (float)tt.kl;
        acc[kEntropy] += (float)tt.entropy;
        acc[kClip] += tt.clipped ? 1.0f : 0.0f;
        acc[kMismatch] += (float)tt.mismatch_kl;
        acc[kTisClip] += tt.tis_clipped ? 1.0f : 0.0f;
        acc[kLoss] += (float)(tt.loss * weight);
      }
    }
    // a batch-wise loss is the same on every rank: each adds its share of the sum over ranks
    acc[kAux] += (float)(batch_balance ? a.aux_sum / comm.world_size() : a.aux_sum);
    acc[kZ] += (float)a.z_sum;
    for (int e = 0; e < E; e++) acc[kNum + e] += (float)a.expert_load[e];
    for (int l = 0; l < L; l++)
      for (int e = 0; e < E; e++)
        acc[kNum + E + (size_t)l * E + e] += (float)a.layers[l].moe.expert_load[e];
    model::model_backward(ps, comm, a.logits.data(), aux_weight, z_weight, a);
    if (progress) progress((int)mb + 1, (int)mbs.size());
  }
  comm.allreduce_sum(ps.grad_dense.data(), ps.grad_dense.size());
  comm.allreduce_sum(acc.data(), acc.size());

  StepMetrics m;
  m.tokens = n_tok;
  m.sequences = n_seq;
  m.aux_loss = acc[kAux] / aux_norm;
  m.z_loss = acc[kZ] / (n_valid * L_moe);
  m.policy_loss = acc[kPolicy] / n_tok;
  m.kl = acc[kKl] / n_tok;
  m.entropy = acc[kEntropy] / n_tok;
  m.clip_frac = acc[kClip] / n_tok;
  m.mismatch_kl = acc[kMismatch] / n_tok;
  m.tis_clip_frac = acc[kTisClip] / n_tok;
  m.loss = acc[kLoss] + lc.aux_coef * m.aux_loss + lc.z_coef * m.z_loss;
  m.flops = acc[kFlops];
  double total_load = 0.0;
  for (int e = 0; e < E; e++) total_load += acc[kNum + e];
  for (int e = 0; e < E; e++) m.expert_load.push_back(acc[kNum + e] / std::max(1.0, total_load));
  for (int l = 0; l < L; l++) {
    const float* layer = acc.data() + kNum + E + (size_t)l * E;
    double layer_total = 0.0;
    for (int e = 0; e < E; e++) layer_total += layer[e];
    std::vector<double> share(E);
    for (int e = 0; e < E; e++) share[e] = layer[e] / std::max(1.0, layer_total);
    m.expert_load_layers.push_back(std::move(share));
  }
  m.seconds = now_s() - t0;
  m.ep_seconds = comm.stats.seconds - ep_s0;
  m.ep_bytes = (double)(comm.stats.bytes - ep_b0);
  return m;
}

StepMetrics train_step(model::ParamStore& ps, io::OptimizerState& opt, model::ExpertComm& comm,
                       std::vector<TrainSequence>& batch, const LossConfig& lc,
                       const AdamWConfig& ac, const MicroBatchProgress& progress) {
  const double t0 = now_s();
  StepMetrics m = compute_gradients(ps, comm, batch, lc, progress);
  float lr = 0.0f;
  m.grad_norm = adamw_step(ps, opt, ac, comm, &lr);
  m.lr = lr;
  m.seconds = now_s() - t0;
  return m;
}

double kl_value(double d, KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::K1: return -d;
    case KlEstimator::K2: return 0.5 * d * d;
    case KlEstimator::K3: return std::exp(d) - d - 1.0;
  }
  MOERL_FAIL(Internal, "unknown KL estimator");
}

double kl_gradient(double d, KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::K1: return 1.0;
    case KlEstimator::K2: return -d;
    case KlEstimator::K3: return 1.0 - std::exp(d);
  }
  MOERL_FAIL(Internal, "unknown KL estimator");
}

double sequence_kl(const TrainSequence& s, KlEstimator estimator) {
  MOERL_CHECK(s.ref_logprobs.size() == s.old_logprobs.size(),
              "sequence_kl needs the sequence's ref_logprobs (fill_ref_logprobs first)");
  double sum = 0.0;
  for (size_t j = 0; j < s.old_logprobs.size(); j++)
    if (s.trained((int)j)) sum += kl_value((double)s.ref_logprobs[j] - s.old_logprobs[j], estimator);
  return sum;
}

void fill_ref_logprobs(model::ParamStore& ps, model::ExpertComm& comm,
                       std::vector<TrainSequence>& batch, const LossConfig& lc,
                       const MicroBatchProgress& progress) {
  const model::ModelConfig& cfg = ps.layout.cfg;
  const int V = cfg.vocab_size;
  const float inv_tau = 1.0f / lc.temperature;
  model::Activations a;
  const std::vector<std::vector<int>> mbs =
      micro_batches((int)batch.size(), comm.rank(), comm.world_size(), lc.micro_batch);
  for (size_t mb = 0; mb < mbs.size(); mb++) {
    const std::vector<int>& ids = mbs[mb];
    Packed pk = pack(batch, ids, cfg.max_seq_len);
    const std::vector<int32_t> rows = loss_rows(batch, ids, pk.T);
    model::model_forward(ps, comm, pk.tokens.data(), pk.lengths.data(), pk.B, pk.T, a, &rows);
    const float* lg = a.logits.data();
    for (int b = 0; b < pk.B; b++) {
      TrainSequence& s = batch[ids[b]];
      s.ref_logprobs.clear();
      for (int t = s.prompt_len - 1; t + 1 < (int)s.tokens.size(); t++) {
        if (!s.trained(t + 1 - s.prompt_len)) {
          s.ref_logprobs.push_back(0.0f);
          continue;
        }
        const model::SoftmaxStats st = model::softmax_stats(lg, V, inv_tau, false);
        s.ref_logprobs.push_back((float)st.logprob(lg, s.tokens[t + 1], inv_tau));
        lg += V;
      }
    }
    if (progress) progress((int)mb + 1, (int)mbs.size());
  }
}

std::string StepMetrics::to_json(int64_t step) const {
  std::ostringstream os;
  auto f = [](double x) { return io::json_float(x); };
  os << "{\"step\":" << step << ",\"loss\":" << f(loss) << ",\"policy_loss\":" << f(policy_loss)
     << ",\"kl\":" << f(kl) << ",\"entropy\":" << f(entropy) << ",\"clip_frac\":" << f(clip_frac)
     << ",\"mismatch_kl\":" << f(mismatch_kl) << ",\"tis_clip_frac\":" << f(tis_clip_frac)
     << ",\"aux_loss\":" << f(aux_loss) << ",\"z_loss\":" << f(z_loss)
     << ",\"grad_norm\":" << f(grad_norm) << ",\"lr\":" << f(lr) << ",\"tokens\":" << f(tokens)
     << ",\"sequences\":" << f(sequences) << ",\"seconds\":" << f(seconds)
     << ",\"tokens_per_s\":" << f(tokens / std::max(seconds, 1e-9))
     << ",\"gflops\":" << f(flops / std::max(seconds, 1e-9) / 1e9)
     << ",\"ep_seconds\":" << f(ep_seconds) << ",\"ep_bytes\":" << f(ep_bytes)
     << ",\"expert_load\":[";
  for (size_t e = 0; e < expert_load.size(); e++) os << (e ? "," : "") << f(expert_load[e]);
  os << "],\"expert_load_layers\":[";
  for (size_t l = 0; l < expert_load_layers.size(); l++) {
    os << (l ? ",[" : "[");
    for (size_t e = 0; e < expert_load_layers[l].size(); e++)
      os << (e ? "," : "") << f(expert_load_layers[l][e]);
    os << "]";
  }
  os << "]}";
  return os.str();
}

}  // namespace moerl::rl
