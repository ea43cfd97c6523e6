// moe_hf: moerl checkpoints and Hugging Face model directories.
//
//   moe_hf export --checkpoint DIR --config CONFIG.json --out DIR [--max-shard-bytes 5e9]
//       An HF directory of a committed checkpoint: its weights in the config's dtype, by shards
//       (model.safetensors, or model-0000i-of-0000n.safetensors with the index), the tokenizer
//       and generation config found beside CONFIG.json, config.json last. CONFIG.json is the
//       config.json of the model the campaign started from.
//   moe_hf score (--hf DIR | --checkpoint DIR) (--sequences FILE | --serve) [--max-seq-len N]
//                [--temperature T] [--completions] [--max-batch-tokens N]
//                [--grad-out FILE --loss sft|grpo ...]
//       Teacher-forced log-probs: FILE has JSONL lines {"tokens":[...]} (with "prompt_len",
//       "old_logprobs" and "advantage" for --loss grpo, or "group" and "reward" for advantages
//       by --advantage (a group of equal rewards is left out, as moe_train grpo does),
//       "ref_logprobs" for its --kl-coef (or its --kl-in-reward), and an optional "loss_mask");
//       prints one line per sequence,
//       {"logprobs":[log p(tokens[t] | tokens[<t]) for t >= 1]}, p = softmax(logits / T) as
//       moe_generate samples and records it (default T = 1); with --completions only the
//       tokens t >= prompt_len. --max-batch-tokens N forwards the sequences in order in batches
//       of at most N padded tokens (at least one sequence each; 0 = all in one), which bounds
//       the [batch, T, vocab] logits. --serve (one rank): prints {"ready":true} once the policy
//       is loaded, then for each line of stdin, the path of such a file, its lines and
//       {"done":true,"sequences":n}; exits 0 at the end of stdin (how a rollout worker rescores
//       a shard's chunks with one load). With --grad-out (one rank) the gradients of one step's
//       loss (rl::compute_gradients, every sequence in one micro-batch) go to FILE as F32
//       safetensors under the HF tensor names, and a {"loss":...} line is printed last.
//
// Under the rank contract (MOERL_RANK, ...; none set: one rank) score runs expert parallel:
// every rank takes every sequence, rank 0 prints. Exit 0 done, 2 bad input, 1 retryable.
#include <algorithm>  // std::max, std::copy
#include <cstdio>     // std::printf
#include <iostream>   // std::cin
#include <map>
#include <memory>
#include <sstream>

#include "common/check.h"
#include "io/checkpoint.h"
#include "io/hf.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/expert_comm.h"
#include "model/model.h"
#include "model/ops.h"  // softmax_stats
#include "rl/advantages.h"
#include "rl/trainer.h"
#include "tools/moe_cli.h"
#include "transport/communicator.h"

namespace moerl::tools {
namespace {

std::string dir_of(const std::string& file) {
  size_t slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash);
}

struct ExportOptions {
  std::string checkpoint, config, out;
  double max_shard_bytes = 5e9;
};

int cmd_export(const ExportOptions& o) {
  const model::ModelConfig cfg = io::read_checkpoint_config(o.checkpoint);
  MOERL_CHECK_INPUT(o.config.size() >= 11 && o.config.substr(o.config.size() - 11) == "config.json",
                    "--config must name a config.json, got ", o.config);
  const io::HfModel m = io::read_hf_config(dir_of(o.config), cfg.max_seq_len);
  MOERL_CHECK_INPUT(model::config_to_json(m.cfg) == model::config_to_json(cfg), o.config,
                    " describes ", model::config_to_json(m.cfg), " but checkpoint ", o.checkpoint,
                    " holds ", model::config_to_json(cfg));
  transport::Config one;  // the whole model in one process: every expert
  Rank rank(one, cfg.num_experts);
  model::ParamStore ps(model::make_layout(cfg, 0, cfg.num_experts), false);
  io::load_weights(o.checkpoint, ps);
  io::save_hf(o.out, m, ps, io::read_file(o.config), (uint64_t)o.max_shard_bytes,
              io::hf_side_files(dir_of(o.config)));
  std::printf("{\"done\":true,\"out\":%s,\"dtype\":\"%s\"}\n", io::json_quote(o.out).c_str(),
              m.dtype.c_str());
  return 0;
}

struct ScoreOptions {
  std::string hf, checkpoint, sequences, grad_out, loss = "sft";
  int max_seq_len = 0;
  bool completions = false, serve = false;
  int64_t max_batch_tokens = 0;
  rl::LossConfig lc;
  rl::AdvantageEstimator advantage = rl::AdvantageEstimator::GroupNorm;
  bool kl_in_reward = false;
};

// GRPO lines give their "advantage", or all give "group" and "reward" for `estimator`; a
// `kl_penalty` > 0 (--kl-in-reward) takes kl_penalty x rl::sequence_kl from each reward first.
std::vector<rl::TrainSequence> read_sequences(const std::string& path, bool grpo,
                                              rl::AdvantageEstimator estimator,
                                              float kl_penalty = 0.0f,
                                              rl::KlEstimator kl_estimator = rl::KlEstimator::K3) {
  std::vector<rl::TrainSequence> out;
  std::vector<rl::RewardGroup> groups;       // in order of first appearance
  std::map<int64_t, size_t> group_of;        // "group" -> index in groups
  std::vector<std::vector<size_t>> members;  // per group, its lines
  constexpr size_t kNoGroup = SIZE_MAX;
  io::for_each_json_line(path, [&](const io::Json& j, const std::string& what) {
    rl::TrainSequence s;
    for (const io::Json& t : io::array_field(j, "tokens", what))
      s.tokens.push_back(io::as_int(t, what + " tokens"));
    MOERL_CHECK_INPUT(s.tokens.size() >= 2, what, ": needs at least 2 tokens");
    s.prompt_len = j.contains("prompt_len") ? io::int_field(j, "prompt_len", what) : 1;
    MOERL_CHECK_INPUT(s.prompt_len >= 1 && s.prompt_len < (int)s.tokens.size(), what,
                      ": prompt_len must be in [1, tokens)");
    size_t group = kNoGroup;
    if (grpo) {
      for (const io::Json& v : io::array_field(j, "old_logprobs", what))
        s.old_logprobs.push_back((float)io::as_number(v, what + " old_logprobs"));
      MOERL_CHECK_INPUT(s.old_logprobs.size() == s.tokens.size() - s.prompt_len, what,
                        ": old_logprobs must have one entry per completion token");
      const bool by_reward = j.contains("reward");
      MOERL_CHECK_INPUT(out.empty() || by_reward == !groups.empty(), what,
                        ": give every line \"advantage\", or every line \"group\" and \"reward\"");
      if (by_reward) {
        const int64_t id = io::int_field(j, "group", what);
        auto [it, fresh] = group_of.try_emplace(id, groups.size());
        if (fresh) groups.emplace_back();
        group = it->second;
        groups[group].rewards.push_back((float)io::number_field(j, "reward", what));
        members.resize(groups.size());
        members[group].push_back(out.size());
      } else {
        s.advantage = (float)io::number_field(j, "advantage", what);
      }
      if (j.contains("ref_logprobs"))
        for (const io::Json& v : io::array_field(j, "ref_logprobs", what))
          s.ref_logprobs.push_back((float)io::as_number(v, what + " ref_logprobs"));
      MOERL_CHECK_INPUT(s.ref_logprobs.empty() || s.ref_logprobs.size() == s.old_logprobs.size(),
                        what, ": ref_logprobs must have one entry per completion token");
    }
    s.loss_mask = loss_mask_field(j, s.tokens.size() - s.prompt_len, what);
    if (group != kNoGroup) {
      const std::vector<uint8_t>& m = s.loss_mask;
      groups[group].trained_tokens.push_back(
          m.empty() ? (int)s.old_logprobs.size() : (int)std::count(m.begin(), m.end(), 1));
    }
    out.push_back(std::move(s));
  });
  MOERL_CHECK_INPUT(!out.empty(), path, ": no sequences");
  if (groups.empty()) return out;
  // advantages as moe_train grpo makes them; a group without signal is not trained on
  for (size_t g = 0; g < groups.size() && kl_penalty > 0.0f; g++)
    for (size_t k = 0; k < members[g].size(); k++) {
      const rl::TrainSequence& s = out[members[g][k]];
      MOERL_CHECK_INPUT(s.ref_logprobs.size() == s.old_logprobs.size(), path,
                        ": --kl-in-reward needs every line's ref_logprobs");
      const float kl = (float)rl::sequence_kl(s, kl_estimator);
      float& r = groups[g].rewards[k];
      r = (float)((double)r - (double)kl_penalty * kl);
    }
  const std::vector<std::vector<float>> adv = rl::advantages(groups, estimator);
  std::vector<rl::TrainSequence> kept;
  for (size_t g = 0; g < groups.size(); g++)
    for (size_t k = 0; k < adv[g].size(); k++) {
      kept.push_back(std::move(out[members[g][k]]));
      kept.back().advantage = adv[g][k];
    }
  MOERL_CHECK_INPUT(!kept.empty(), path, ": every group's rewards are equal: nothing to train on");
  return kept;
}

// Prints each sequence's log-probs (rank 0): every rank forwards every sequence, right-padded
// into batches of at most max_batch_tokens padded tokens (in order, at least one sequence each);
// log p under softmax(logits / T) as the sampler records it (model::softmax_stats, float64 from
// float32 logits).
void print_logprobs(model::ParamStore& ps, Rank& rank, const std::vector<rl::TrainSequence>& seqs,
                    const ScoreOptions& o) {
  const int V = ps.layout.cfg.vocab_size;
  const float inv_tau = 1.0f / o.lc.temperature;
  model::Activations a;
  for (size_t first = 0; first < seqs.size();) {
    size_t end = first;
    int T = 0;
    while (end < seqs.size()) {
      const int T2 = std::max(T, (int)seqs[end].tokens.size());
      if (end > first && o.max_batch_tokens > 0 &&
          (int64_t)(end + 1 - first) * T2 > o.max_batch_tokens)
        break;
      T = T2;
      end++;
    }
    const int B = (int)(end - first);
    std::vector<int32_t> tokens((size_t)B * T, 0), lengths(B);
    for (int b = 0; b < B; b++) {
      const rl::TrainSequence& s = seqs[first + b];
      lengths[b] = (int)s.tokens.size();
      std::copy(s.tokens.begin(), s.tokens.end(), tokens.begin() + (size_t)b * T);
    }
    model::model_forward(ps, rank.ep, tokens.data(), lengths.data(), B, T, a);
    if (rank.ep.rank() == 0) {
      for (int b = 0; b < B; b++) {
        const rl::TrainSequence& s = seqs[first + b];
        const int from = o.completions ? s.prompt_len : 1;
        std::ostringstream line;
        line << "{\"logprobs\":[";
        for (int t = from; t < lengths[b]; t++) {
          const float* lg = a.logits.data() + ((size_t)b * T + t - 1) * V;
          const model::SoftmaxStats st = model::softmax_stats(lg, V, inv_tau, false);
          line << (t > from ? "," : "") << io::json_float(st.logprob(lg, s.tokens[t], inv_tau));
        }
        line << "]}";
        std::printf("%s\n", line.str().c_str());
      }
    }
    first = end;
  }
}

int cmd_score(ScoreOptions& o) {
  MOERL_CHECK_INPUT(o.hf.empty() != o.checkpoint.empty(), "give one of --hf and --checkpoint");
  MOERL_CHECK_INPUT(o.sequences.empty() == o.serve, "give one of --sequences and --serve");
  MOERL_CHECK_INPUT(!o.serve || o.grad_out.empty(), "--serve prints log-probs only, not --grad-out");
  io::HfModel hf;
  model::ModelConfig cfg;
  if (!o.hf.empty()) {
    hf = io::read_hf_config(o.hf, o.max_seq_len);
    cfg = hf.cfg;
  } else {
    cfg = io::read_checkpoint_config(o.checkpoint);
  }
  const bool grpo = o.loss == "grpo";
  std::vector<rl::TrainSequence> seqs;
  if (!o.serve)
    seqs = read_sequences(o.sequences, grpo, o.advantage, o.kl_in_reward ? o.lc.kl_coef : 0.0f,
                          o.lc.kl_estimator);
  Rank rank(transport::Config::from_env(), cfg.num_experts);
  MOERL_CHECK_INPUT(!o.serve || rank.ep.world_size() == 1, "--serve runs on one rank");
  model::ParamStore ps(model::make_layout(cfg, rank.ep.first_expert(), rank.ep.num_local_experts()));
  if (!o.hf.empty())
    io::load_hf_weights(hf, ps);
  else
    io::load_weights(o.checkpoint, ps);

  if (o.serve) {
    // one request per stdin line: a sequences file, answered by its lines and a done line
    std::printf("{\"ready\":true}\n");
    std::fflush(stdout);
    std::string path;
    while (std::getline(std::cin, path)) {
      if (path.empty()) continue;
      const std::vector<rl::TrainSequence> batch = read_sequences(path, false, o.advantage);
      print_logprobs(ps, rank, batch, o);
      std::printf("{\"done\":true,\"sequences\":%zu}\n", batch.size());
      std::fflush(stdout);
    }
    return 0;
  }
  print_logprobs(ps, rank, seqs, o);
  if (o.grad_out.empty()) return 0;
  MOERL_CHECK_INPUT(rank.ep.world_size() == 1 && !o.hf.empty(),
                    "--grad-out needs one rank and --hf (it writes every tensor under HF names)");
  o.lc.objective = grpo ? rl::Objective::Grpo : rl::Objective::Sft;
  if (o.kl_in_reward) o.lc.kl_coef = 0.0f;  // the KL went into the rewards
  for (size_t i = 0; i < seqs.size() && grpo && o.lc.kl_coef != 0.0f; i++)
    MOERL_CHECK_INPUT(!seqs[i].ref_logprobs.empty(), o.sequences, " line ", i + 1,
                      ": --kl-coef needs its ref_logprobs");
  o.lc.micro_batch = (int)seqs.size();
  rl::StepMetrics sm = rl::compute_gradients(ps, rank.ep, seqs, o.lc);
  // the gradient arenas have the parameters' layout: write them as a model of gradients
  model::ParamStore grads(ps.layout);
  grads.dense = ps.grad_dense;
  grads.experts = ps.grad_experts;
  io::HfModel as_f32 = hf;
  as_f32.dtype = "F32";
  std::vector<io::TensorOut> tensors;
  for (const auto* list : {&grads.layout.dense, &grads.layout.experts})
    for (const model::TensorSpec& s : *list) {
      const float* base = (s.expert >= 0 ? grads.experts.data() : grads.dense.data()) + s.offset;
      const size_t cols = s.numel / (size_t)s.shape[0];
      for (const io::HfPiece& p : io::hf_pieces(as_f32, s.name, s.shape[0])) {
        std::vector<int64_t> shape = s.shape;
        shape[0] = p.rows;
        tensors.push_back({p.hf_name, shape, base + p.row0 * cols});
      }
    }
  io::write_safetensors(o.grad_out, tensors, "F32");
  std::printf("{\"loss\":%s,\"aux_loss\":%s,\"policy_loss\":%s,\"entropy\":%s}\n",
              io::json_float(sm.loss).c_str(), io::json_float(sm.aux_loss).c_str(),
              io::json_float(sm.policy_loss).c_str(), io::json_float(sm.entropy).c_str());
  return 0;
}

}  // namespace
}  // namespace moerl::tools

int main(int argc, char** argv) {
  using namespace moerl::tools;
  CLI::App app{"Exports moerl checkpoints as Hugging Face model directories; scores sequences.",
               "moe_hf"};
  app.option_defaults()->always_capture_default();
  ExportOptions ex;
  ScoreOptions sc;
  CLI::App* ex_cmd = app.add_subcommand("export", "write a checkpoint as an HF model directory");
  ex_cmd->add_option("--checkpoint", ex.checkpoint, "committed checkpoint directory")->required();
  ex_cmd->add_option("--config", ex.config, "config.json of the source HF model")->required();
  ex_cmd->add_option("--out", ex.out, "HF model directory to write")->required();
  ex_cmd->add_option("--max-shard-bytes", ex.max_shard_bytes, "largest safetensors shard")
      ->check(kPositive);
  CLI::App* sc_cmd = app.add_subcommand("score", "teacher-forced log-probs (and gradients)");
  sc_cmd->add_option("--hf", sc.hf, "HF model directory");
  sc_cmd->add_option("--checkpoint", sc.checkpoint, "moerl checkpoint directory");
  sc_cmd->add_option("--sequences", sc.sequences, "JSONL of {\"tokens\":[...]}");
  sc_cmd->add_flag("--serve", sc.serve,
                   "load the policy once, then score the sequences file named by each stdin line");
  sc_cmd->add_option("--max-seq-len", sc.max_seq_len, "with --hf: T_max (0 = the config's)")
      ->check(kNonNegative);
  sc_cmd->add_option("--grad-out", sc.grad_out, "safetensors file for the loss's gradients");
  sc_cmd->add_option("--loss", sc.loss, "loss of --grad-out")->check(CLI::IsMember({"sft", "grpo"}));
  sc_cmd->add_option("--aux-coef", sc.lc.aux_coef, "balance loss weight");
  sc_cmd->add_option("--z-coef", sc.lc.z_coef, "router z-loss weight");
  add_policy_loss_options(sc_cmd, sc.lc);
  add_advantage_option(sc_cmd, sc.advantage);
  sc_cmd->add_flag("--kl-in-reward", sc.kl_in_reward,
                   "rows by reward: --kl-coef x the rows' KL (ref_logprobs - old_logprobs) off each "
                   "reward before its advantage, no KL term in the loss");
  sc_cmd->add_option("--kl-coef", sc.lc.kl_coef, "KL weight (rows give ref_logprobs)")
      ->check(kNonNegative);
  sc_cmd->add_option("--entropy-coef", sc.lc.entropy_coef, "GRPO entropy bonus");
  sc_cmd->add_option("--temperature", sc.lc.temperature,
                     "T of the log-probs, softmax(logits / T) (and of the GRPO loss)")
      ->check(kPositive);
  sc_cmd->add_flag("--completions", sc.completions,
                   "print the log-probs of tokens t >= prompt_len only");
  sc_cmd->add_option("--max-batch-tokens", sc.max_batch_tokens,
                     "padded tokens per forward at most (0 = every sequence in one)")
      ->check(kNonNegative);
  return run_tool(app, argc, argv, [&] {
    if (*ex_cmd) return cmd_export(ex);
    if (*sc_cmd) {
      keep_freed_memory();
      return cmd_score(sc);
    }
    MOERL_FAIL(BadInput, "give a command: export or score (see moe_hf --help)");
  });
}
