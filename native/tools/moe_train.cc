// moe_train: create, SFT-train and GRPO-train the MoE policy; one process per EP rank.
//
//   moe_train init   --out DIR [--seed S] [--dim 128 --layers 2 --heads 4 --experts 8
//                    --top-k 2 --expert-dim 128 --max-seq-len 32]
//   moe_train sft    --checkpoint DIR --out DIR --task add|--data FILE [--steps 200 ...]
//                    (--data lines: {"prompt","answer"} text or {"prompt_tokens","tokens"} ids,
//                    with an optional "loss_mask": 0/1 per token, 0 = not learned)
//   moe_train grpo   --checkpoint DIR --out DIR (--rollouts-file LIST | --rollouts F1,F2)
//                    (--rewards-file LIST | --rewards R1,R2) [...]
//   moe_train sgemm  [--size 1024 --repeats 5]   (OpenBLAS sgemm GFLOP/s: median and best)
//   moe_train sha256 --file F [--repeats 5]      (sha256 seconds and MB/s: median)
// `moe_train <command> --help` lists every option with its default. LIST: a text file with
// one path per line (blank lines ignored), for campaigns with more files than one argument
// can hold.
//
// Rank contract: MOERL_RANK, MOERL_WORLD_SIZE, MOERL_COORDINATOR, MOERL_FI_PROVIDER. Every
// rank gets the same flags except that --checkpoint, --ref-checkpoint and --out may name a
// rank-local directory (io/checkpoint.h). Under the rank program, init, sft and grpo keep
// their group until every rank's outputs are stored (MOERL_STORED_FD, tools/moe_cli.h).
// Exit 0 done (or --help), 2 bad input (do not retry), 75 a peer was lost, anything else
// retryable. stdout of rank 0, one JSON object per line: the metrics of each optimizer step
// (also appended to --metrics if given) and, during a long phase, at most about once per
// second
//   {"progress":true,"phase":"sft"|"grpo"|"ref_logprobs"|"read_rollouts",...}
// with "step"/"steps" (optimizer steps; minibatches for ref_logprobs) and
// "micro_batch"/"micro_batches" (this rank's, within the step), or "files"/"of".
#include <cblas.h>  // cblas_sgemm for the sgemm benchmark

#include <algorithm>  // std::min, std::count
#include <chrono>     // steady_clock
#include <cmath>      // std::sqrt
#include <cstdio>     // std::printf
#include <fstream>    // metrics file
#include <map>
#include <memory>
#include <sstream>

#include "common/check.h"
#include "io/checkpoint.h"
#include "io/hf.h"
#include "io/json.h"
#include "io/sha256.h"
#include "model/expert_comm.h"
#include "model/kernels.h"
#include "model/weights.h"
#include "rl/advantages.h"
#include "rl/trainer.h"
#include "tasks/tasks.h"
#include "tasks/tokenizer.h"
#include "tools/moe_cli.h"
#include "transport/communicator.h"

namespace moerl::tools {
namespace {

std::unique_ptr<model::ParamStore> make_store(const model::ModelConfig& cfg, model::ExpertComm& ep) {
  return std::make_unique<model::ParamStore>(
      model::make_layout(cfg, ep.first_expert(), ep.num_local_experts()));
}

void emit_metrics(model::ExpertComm& ep, const std::string& path, const std::string& line) {
  if (ep.rank() != 0) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (path.empty()) return;
  // the metrics file may sit in a directory of its own that nothing created yet
  if (size_t slash = path.rfind('/'); slash != std::string::npos && slash > 0)
    io::make_dirs(path.substr(0, slash));
  std::ofstream out(path, std::ios::app);
  MOERL_CHECK_INPUT(out.good(), "cannot append to metrics file ", path);
  out << line << "\n";
}

void add_adamw_options(CLI::App* cmd, rl::AdamWConfig& c) {
  cmd->add_option("--lr", c.lr, "peak learning rate")->check(kNonNegative);
  cmd->add_option("--weight-decay", c.weight_decay, "decoupled weight decay (matrices)");
  cmd->add_option("--grad-clip", c.grad_clip, "global gradient norm limit, <= 0 disables");
  cmd->add_option("--warmup-steps", c.warmup_steps, "linear warmup steps")->check(kNonNegative);
  cmd->add_option("--min-lr-ratio", c.min_lr_ratio, "cosine decay floor, fraction of --lr");
  cmd->add_option("--beta2", c.beta2, "AdamW second-moment decay");
}

void add_progress_option(CLI::App* cmd, double& interval_s) {
  cmd->add_option("--progress-interval", interval_s, "seconds between progress lines")
      ->check(kNonNegative);
}

void add_loss_options(CLI::App* cmd, rl::LossConfig& c) {
  cmd->add_option("--aux-coef", c.aux_coef, "sequence-wise load-balance loss weight");
  cmd->add_option("--z-coef", c.z_coef, "router z-loss weight");
  cmd->add_option("--micro-batch", c.micro_batch, "sequences per forward/backward on a rank")
      ->check(kPositive);
}

// Rank 0 prints {"progress":true,"phase":...} lines during long phases.
struct PhaseProgress {
  Progress line;
  bool is_root;
  PhaseProgress(const transport::Config& rank, double interval_s)
      : line(interval_s), is_root(rank.rank == 0) {}
  void report(const std::string& phase, const std::string& fields) {
    if (is_root) line.maybe_print([&] { return "{\"progress\":true,\"phase\":\"" + phase + "\"," + fields + "}"; });
  }
  // The callback train_step / fill_ref_logprobs call after each micro-batch.
  rl::MicroBatchProgress step(const std::string& phase, int64_t step, int64_t steps) {
    return [this, phase, step, steps](int done, int total) {
      report(phase, "\"step\":" + std::to_string(step) + ",\"steps\":" + std::to_string(steps) +
                        ",\"micro_batch\":" + std::to_string(done) +
                        ",\"micro_batches\":" + std::to_string(total));
    };
  }
};

struct InitOptions {
  model::ModelConfig cfg;
  uint64_t seed = 0;
  std::string out, from_hf;
  bool max_seq_len_given = false;
};

void add_init_options(CLI::App* cmd, InitOptions& o) {
  o.cfg.vocab_size = tasks::kVocabSize;
  o.cfg.max_seq_len = 32;
  o.cfg.dim = 128;
  o.cfg.num_layers = 2;
  o.cfg.num_heads = 4;
  o.cfg.num_experts = 8;
  o.cfg.top_k = 2;
  o.cfg.expert_dim = 128;
  cmd->add_option("--out", o.out, "checkpoint directory to write")->required();
  cmd->add_option("--seed", o.seed, "initialisation seed");
  cmd->add_option("--vocab-size", o.cfg.vocab_size, "V");
  cmd->add_option("--max-seq-len", o.cfg.max_seq_len, "T_max, positions");
  cmd->add_option("--dim", o.cfg.dim, "C, model width");
  cmd->add_option("--layers", o.cfg.num_layers, "L");
  cmd->add_option("--heads", o.cfg.num_heads, "H, must divide --dim");
  cmd->add_option("--experts", o.cfg.num_experts, "E");
  cmd->add_option("--top-k", o.cfg.top_k, "K, experts per token");
  cmd->add_option("--expert-dim", o.cfg.expert_dim, "F, expert width");
  cmd->add_option("--from-hf", o.from_hf,
                  "a Hugging Face model directory (qwen3_moe, mixtral): its config and weights "
                  "replace the shape flags and the random init (--max-seq-len still applies; "
                  "without it min(max_position_embeddings, 4096))");
  cmd->parse_complete_callback([cmd, &o] { o.max_seq_len_given = cmd->count("--max-seq-len") > 0; });
}

// The HF directory's model, this rank's tensors only (io/hf.h).
int cmd_init_from_hf(const InitOptions& o) {
  io::HfModel m = io::read_hf_config(o.from_hf, o.max_seq_len_given ? o.cfg.max_seq_len : 0);
  if (!o.max_seq_len_given) m.cfg.max_seq_len = std::min(m.cfg.max_seq_len, 4096);  // KV cache bound
  Rank rank(transport::Config::from_env(), m.cfg.num_experts);
  // parameters only: the rank's peak memory is its dense tensors and experts
  auto ps = std::make_unique<model::ParamStore>(
      model::make_layout(m.cfg, rank.ep.first_expert(), rank.ep.num_local_experts()), false);
  io::load_hf_weights(m, *ps);
  io::OptimizerState opt;  // zeros, written without optimizer files
  io::save_checkpoint(o.out, *ps, opt, rank.ep,
                      "{\"kind\":\"init\",\"huggingFace\":{\"family\":\"" + m.family +
                          "\",\"dtype\":\"" + m.dtype + "\"}}");
  size_t params = ps->layout.dense_numel + ps->layout.expert_numel * rank.ep.world_size();
  if (rank.ep.rank() == 0)
    std::printf("{\"done\":true,\"out\":%s,\"parameters\":%zu,\"family\":\"%s\",\"config\":%s}\n",
                io::json_quote(o.out).c_str(), params, m.family.c_str(),
                model::config_to_json(m.cfg).c_str());
  wait_until_stored(rank);
  return 0;
}

int cmd_init(const InitOptions& o) {
  if (!o.from_hf.empty()) return cmd_init_from_hf(o);
  const model::ModelConfig& cfg = o.cfg;
  model::validate(cfg);
  Rank rank(transport::Config::from_env(), cfg.num_experts);
  auto ps = make_store(cfg, rank.ep);
  ps->init_random(o.seed);
  io::OptimizerState opt;  // zeros, written without optimizer files
  io::save_checkpoint(o.out, *ps, opt, rank.ep,
                      "{\"kind\":\"init\",\"seed\":" + std::to_string(o.seed) + "}");
  size_t params = ps->layout.dense_numel + ps->layout.expert_numel * rank.ep.world_size();
  if (rank.ep.rank() == 0)
    std::printf("{\"done\":true,\"out\":%s,\"parameters\":%zu,\"config\":%s}\n",
                io::json_quote(o.out).c_str(), params, model::config_to_json(cfg).c_str());
  wait_until_stored(rank);
  return 0;
}

struct SftOptions {
  std::string in, out, task, data, metrics;
  int64_t steps = 200, batch_size = 64, first_prompt = 0;
  uint64_t seed = 0;
  double progress_interval = 1.0;
  rl::LossConfig lc;
  rl::AdamWConfig ac;
  CLI::Option* decay_steps = nullptr;  // default --steps when not given
};

void add_sft_options(CLI::App* cmd, SftOptions& o) {
  o.lc.objective = rl::Objective::Sft;
  o.lc.micro_batch = 64;
  o.ac.lr = 3e-3f;
  cmd->add_option("--checkpoint", o.in, "checkpoint to start from")->required();
  cmd->add_option("--out", o.out, "checkpoint directory to write")->required();
  CLI::Option* task = cmd->add_option("--task", o.task, "built-in task: add, sort or reverse");
  cmd->add_option("--data", o.data,
                  "JSONL instead of --task, a line {\"prompt\":..,\"answer\":..} (text, the built-in "
                  "tokenizer, its eos appended) or {\"prompt_tokens\":[ids],\"tokens\":[ids]} (the "
                  "completion learned as given)")
      ->excludes(task);
  cmd->add_option("--steps", o.steps, "optimizer steps")->check(kPositive);
  cmd->add_option("--batch-size", o.batch_size, "sequences per step")->check(kPositive);
  cmd->add_option("--seed", o.seed, "prompt seed of --task");
  cmd->add_option("--first-prompt", o.first_prompt, "first prompt id (or --data line)")
      ->check(kNonNegative);
  cmd->add_option("--metrics", o.metrics, "JSONL file to append step metrics to");
  add_progress_option(cmd, o.progress_interval);
  add_loss_options(cmd, o.lc);
  add_adamw_options(cmd, o.ac);
  o.decay_steps = cmd->add_option("--decay-steps", o.ac.decay_steps,
                                  "cosine decay steps, 0 = constant [default: --steps]")
                      ->check(kNonNegative)
                      ->default_str("");
}

// The token ids of an integer array field, each in [0, vocab_size).
std::vector<int32_t> token_ids(const io::Json& j, const std::string& key, const std::string& what,
                               int vocab_size) {
  std::vector<int32_t> ids;
  for (const io::Json& t : io::array_field(j, key, what)) {
    int64_t id = io::as_integer(t, what + " " + key);
    MOERL_CHECK_INPUT(id >= 0 && id < vocab_size, what, " ", key, ": token id ", id,
                      " outside the vocabulary of ", vocab_size);
    ids.push_back((int32_t)id);
  }
  MOERL_CHECK_INPUT(!ids.empty(), what, " ", key, ": empty");
  return ids;
}

// Text through the built-in tokenizer, its eos appended: the answer is learned.
rl::TrainSequence text_example(const std::string& prompt, const std::string& answer) {
  rl::TrainSequence seq;
  seq.tokens = tasks::encode(prompt);
  seq.prompt_len = (int)seq.tokens.size();
  for (int32_t t : tasks::encode(answer)) seq.tokens.push_back(t);
  seq.tokens.push_back(tasks::kEos);
  return seq;
}

// One --data line: token ids as given (a model with its own tokenizer), or text.
rl::TrainSequence sft_example(const io::Json& j, const std::string& what, int vocab_size) {
  if (!j.contains("prompt_tokens"))
    return text_example(io::string_field(j, "prompt", what), io::string_field(j, "answer", what));
  rl::TrainSequence seq;
  seq.tokens = token_ids(j, "prompt_tokens", what, vocab_size);
  seq.prompt_len = (int)seq.tokens.size();
  for (int32_t t : token_ids(j, "tokens", what, vocab_size)) seq.tokens.push_back(t);
  seq.loss_mask = loss_mask_field(j, seq.tokens.size() - seq.prompt_len, what);
  return seq;
}

int cmd_sft(SftOptions& o) {
  MOERL_CHECK_INPUT(o.task.empty() != o.data.empty(),
                    "give exactly one of --task (built-in) and --data (JSONL examples)");
  if (!o.task.empty()) tasks::check_task(o.task);
  const std::string &task = o.task, &data = o.data;
  const int64_t steps = o.steps, batch_size = o.batch_size, first_prompt = o.first_prompt;
  const uint64_t seed = o.seed;

  model::ModelConfig cfg = io::read_checkpoint_config(o.in);
  std::vector<rl::TrainSequence> examples;  // --data: cycled through in file order
  if (!data.empty()) {
    io::for_each_json_line(data, [&](const io::Json& j, const std::string& what) {
      examples.push_back(sft_example(j, what, cfg.vocab_size));
    });
    MOERL_CHECK_INPUT(!examples.empty(), data, " holds no examples");
  }
  transport::Config tc = transport::Config::from_env();
  Rank rank(tc, cfg.num_experts);
  auto ps = make_store(cfg, rank.ep);
  io::OptimizerState opt;
  io::load_checkpoint(o.in, *ps, opt);
  if (o.decay_steps->count() == 0) o.ac.decay_steps = steps;
  o.ac.schedule_start = opt.step;
  PhaseProgress progress(tc, o.progress_interval);
  for (int64_t s = 0; s < steps; s++) {
    std::vector<rl::TrainSequence> batch;
    for (int64_t i = 0; i < batch_size; i++) {
      int64_t id = first_prompt + s * batch_size + i;
      if (!examples.empty()) {
        batch.push_back(examples[(size_t)(id % (int64_t)examples.size())]);
      } else {
        tasks::Prompt p = tasks::make_prompt(task, tasks::Split::Train, seed, id);
        batch.push_back(text_example(p.text, p.answer));
      }
    }
    rl::StepMetrics m = rl::train_step(*ps, opt, rank.ep, batch, o.lc, o.ac,
                                       progress.step("sft", s, steps));
    emit_metrics(rank.ep, o.metrics, m.to_json(s));
  }
  io::save_checkpoint(o.out, *ps, opt, rank.ep,
                      "{\"kind\":\"sft\",\"task\":" + io::json_quote(task.empty() ? data : task) + "}");
  wait_until_stored(rank);
  return 0;
}

struct GrpoOptions {
  std::string in, out, ref, metrics;
  PathList rollouts, rewards;
  int64_t iteration = 0, minibatches = 1, epochs = 1;
  double progress_interval = 1.0;
  rl::AdvantageEstimator advantage = rl::AdvantageEstimator::GroupNorm;
  bool mask_truncated = false, kl_in_reward = false;
  rl::LossConfig lc;
  rl::AdamWConfig ac;
};

void add_grpo_options(CLI::App* cmd, GrpoOptions& o) {
  o.lc.objective = rl::Objective::Grpo;
  o.lc.micro_batch = 64;
  o.ac.lr = 1e-3f;
  cmd->add_option("--checkpoint", o.in, "checkpoint the rollouts were sampled from")->required();
  cmd->add_option("--out", o.out, "checkpoint directory to write")->required();
  add_path_list(cmd, "rollouts", "rollout JSONL", o.rollouts);
  add_path_list(cmd, "rewards", "rewards JSONL", o.rewards);
  cmd->add_option("--iteration", o.iteration, "campaign iteration (copied into metrics)");
  cmd->add_option("--ref-checkpoint", o.ref, "reference policy of the KL term");
  cmd->add_option("--kl-coef", o.lc.kl_coef, "KL weight (needs --ref-checkpoint)");
  cmd->add_flag("--kl-in-reward", o.kl_in_reward,
                "the KL is a penalty on each sample's reward before its advantage, not a loss term: "
                "reward - kl-coef * Σ_t kl(rollout log-prob, reference log-prob)");
  cmd->add_option("--entropy-coef", o.lc.entropy_coef, "entropy bonus weight");
  add_policy_loss_options(cmd, o.lc);
  add_advantage_option(cmd, o.advantage);
  cmd->add_flag("--mask-truncated", o.mask_truncated,
                "DAPO's overlong filtering: no loss on samples cut at the length limit "
                "(finish_reason length); they still count in their group's advantages");
  cmd->add_option("--tis-clip", o.lc.tis_clip,
                  "truncated importance sampling cap on p_train / p_rollout, 0 = off")
      ->check(kNonNegative);
  cmd->add_option("--temperature", o.lc.temperature, "sampling temperature of the rollouts")
      ->check(kPositive);
  cmd->add_option("--minibatches", o.minibatches, "optimizer steps per epoch")
      ->check(kPositive);
  cmd->add_option("--epochs", o.epochs, "passes over the rollouts")->check(kPositive);
  cmd->add_option("--metrics", o.metrics, "JSONL file to append step metrics to");
  add_progress_option(cmd, o.progress_interval);
  add_loss_options(cmd, o.lc);
  add_adamw_options(cmd, o.ac);
  cmd->add_option("--decay-steps", o.ac.decay_steps, "cosine decay steps, 0 = constant")
      ->check(kNonNegative);
}

// A rollout record as the trainer's sequence: the prompt, then the completion.
rl::TrainSequence train_sequence(const RolloutRecord& ro) {
  rl::TrainSequence s;
  s.tokens = ro.prompt_tokens;
  s.prompt_len = (int)s.tokens.size();
  s.tokens.insert(s.tokens.end(), ro.tokens.begin(), ro.tokens.end());
  s.old_logprobs = ro.logprobs;
  s.loss_mask = ro.loss_mask;
  return s;
}

// --kl-in-reward: each sample's KL to the reference, summed over its trained tokens (zeros for
// samples with none). Every sample's is needed before any advantage: this rank scores its share
// of them under the reference policy and the sums are allreduced (one rank holds each).
std::vector<float> sample_kls(const std::vector<RolloutRecord>& rollouts, model::ParamStore& ref_ps,
                              Rank& rank, const rl::LossConfig& lc, PhaseProgress& progress) {
  std::vector<rl::TrainSequence> seqs;
  std::vector<size_t> sample;  // index in rollouts of each of seqs
  for (size_t k = 0; k < rollouts.size(); k++) {
    const RolloutRecord& ro = rollouts[k];
    if (ro.tokens.empty()) continue;
    seqs.push_back(train_sequence(ro));
    sample.push_back(k);
  }
  if (!seqs.empty()) rl::fill_ref_logprobs(ref_ps, rank.ep, seqs, lc, progress.step("ref_logprobs", 0, 1));
  std::vector<float> kl(rollouts.size(), 0.0f);
  for (size_t i = 0; i < seqs.size(); i++)
    if (!seqs[i].ref_logprobs.empty()) kl[sample[i]] = (float)rl::sequence_kl(seqs[i], lc.kl_estimator);
  rank.ep.allreduce_sum(kl.data(), kl.size());
  return kl;
}

int cmd_grpo(const GrpoOptions& o) {
  const std::string &in = o.in, &out = o.out, &ref = o.ref, &metrics = o.metrics;
  const int64_t iteration = o.iteration, minibatches = o.minibatches, epochs = o.epochs;
  rl::LossConfig lc = o.lc;  // with --kl-in-reward the loss has no KL term
  if (o.kl_in_reward) lc.kl_coef = 0.0f;
  const rl::AdamWConfig& ac = o.ac;
  MOERL_CHECK_INPUT(o.lc.kl_coef == 0.0f || !ref.empty(), "--kl-coef > 0 needs --ref-checkpoint");
  MOERL_CHECK_INPUT(!o.kl_in_reward || o.lc.kl_coef > 0.0f, "--kl-in-reward needs --kl-coef > 0");
  const std::vector<std::string> rollout_files = o.rollouts.paths(), reward_files = o.rewards.paths();
  transport::Config tc = transport::Config::from_env();
  PhaseProgress progress(tc, o.progress_interval);

  // rewards: (prompt id, sample index) -> reward
  std::map<std::pair<int64_t, int64_t>, float> rewards;
  for (const std::string& path : reward_files) {
    io::for_each_json_line(path, [&](const io::Json& j, const std::string& what) {
      rewards[{io::integer_field(j, "prompt_id", what), io::integer_field(j, "sample_index", what)}] =
          (float)io::number_field(j, "reward", what);
    });
  }
  std::vector<RolloutRecord> rollouts;
  for (size_t f = 0; f < rollout_files.size(); f++) {
    for (RolloutRecord& r : read_rollouts({rollout_files[f]})) rollouts.push_back(std::move(r));
    progress.report("read_rollouts", "\"files\":" + std::to_string(f + 1) + ",\"of\":" +
                                         std::to_string(rollout_files.size()));
  }
  std::sort(rollouts.begin(), rollouts.end(), [](const RolloutRecord& x, const RolloutRecord& y) {
    return std::make_pair(x.prompt_id, x.sample_index) < std::make_pair(y.prompt_id, y.sample_index);
  });
  int64_t overlong_filtered = 0;
  for (RolloutRecord& r : rollouts)
    if (o.mask_truncated && r.finish_reason == "length") {
      r.loss_mask.assign(r.tokens.size(), 0);
      overlong_filtered++;
    }

  // the prompts' groups of samples; a group whose rewards are all equal carries no signal and
  // is skipped (rl::advantages), as is a sample with no trained token
  std::vector<std::pair<size_t, size_t>> spans;  // [first, end) of each group in rollouts
  std::vector<rl::RewardGroup> groups;
  double reward_sum = 0.0;
  for (size_t i = 0; i < rollouts.size();) {
    size_t j = i;
    while (j < rollouts.size() && rollouts[j].prompt_id == rollouts[i].prompt_id) j++;
    rl::RewardGroup g;
    for (size_t k = i; k < j; k++) {
      auto it = rewards.find({rollouts[k].prompt_id, rollouts[k].sample_index});
      MOERL_CHECK_INPUT(it != rewards.end(), "no reward for prompt ", rollouts[k].prompt_id,
                        " sample ", rollouts[k].sample_index);
      g.rewards.push_back(it->second);
      const std::vector<uint8_t>& mask = rollouts[k].loss_mask;
      g.trained_tokens.push_back(mask.empty() ? (int)rollouts[k].tokens.size()
                                              : (int)std::count(mask.begin(), mask.end(), 1));
      reward_sum += it->second;
    }
    groups.push_back(std::move(g));
    spans.emplace_back(i, j);
    i = j;
  }

  // every input is read and checked: the ranks meet
  model::ModelConfig cfg = io::read_checkpoint_config(in);
  Rank rank(tc, cfg.num_experts);
  double reward_kl = 0.0, reward_kl_tokens = 0.0;  // --kl-in-reward's per-token mean, a metric
  if (o.kl_in_reward) {
    auto ref_ps = make_store(cfg, rank.ep);
    io::load_weights(ref, *ref_ps);
    const std::vector<float> kl = sample_kls(rollouts, *ref_ps, rank, o.lc, progress);
    for (size_t g = 0; g < groups.size(); g++)
      for (size_t k = spans[g].first; k < spans[g].second; k++) {
        float& r = groups[g].rewards[k - spans[g].first];
        r = (float)((double)r - (double)o.lc.kl_coef * kl[k]);
        reward_kl += kl[k];
        reward_kl_tokens += groups[g].trained_tokens[k - spans[g].first];
      }
  }
  const std::vector<std::vector<float>> adv = rl::advantages(groups, o.advantage);
  std::vector<rl::TrainSequence> seqs;
  int64_t skipped_groups = 0;
  for (size_t g = 0; g < groups.size(); g++) {
    if (adv[g].empty()) {
      skipped_groups++;
      continue;
    }
    for (size_t k = spans[g].first; k < spans[g].second; k++) {
      const RolloutRecord& ro = rollouts[k];
      if (ro.tokens.empty() || (!ro.loss_mask.empty() &&
                                std::count(ro.loss_mask.begin(), ro.loss_mask.end(), 1) == 0))
        continue;
      rl::TrainSequence s = train_sequence(ro);
      s.advantage = adv[g][k - spans[g].first];
      seqs.push_back(std::move(s));
    }
  }
  const int64_t num_groups = (int64_t)groups.size();

  auto ps = make_store(cfg, rank.ep);
  io::OptimizerState opt;
  io::load_checkpoint(in, *ps, opt);
  // minibatch m holds sequences i with i % minibatches == m
  std::vector<std::vector<rl::TrainSequence>> mbs(minibatches);
  for (size_t i = 0; i < seqs.size(); i++) mbs[i % minibatches].push_back(seqs[i]);
  if (lc.kl_coef != 0.0f && !seqs.empty()) {
    auto ref_ps = make_store(cfg, rank.ep);
    io::load_weights(ref, *ref_ps);
    // per minibatch, so each rank fills exactly the share train_step will give it
    for (int64_t m = 0; m < minibatches; m++)
      if (!mbs[m].empty())
        rl::fill_ref_logprobs(*ref_ps, rank.ep, mbs[m], lc, progress.step("ref_logprobs", m, minibatches));
  }
  int64_t steps = 0;  // optimizer steps this run takes: the non-empty minibatches, per epoch
  for (const auto& mb : mbs) steps += mb.empty() ? 0 : epochs;
  double mean_reward = rollouts.empty() ? 0.0 : reward_sum / rollouts.size();
  int64_t step = 0;
  if (seqs.empty()) {
    emit_metrics(rank.ep, metrics,
                 "{\"iteration\":" + std::to_string(iteration) + ",\"skipped\":true,\"mean_reward\":" +
                     io::json_float(mean_reward) + ",\"groups\":" + std::to_string(num_groups) + "}");
  }
  for (int64_t e = 0; e < epochs && !seqs.empty(); e++) {
    for (int64_t m = 0; m < minibatches; m++) {
      std::vector<rl::TrainSequence>& mb = mbs[m];
      if (mb.empty()) continue;
      rl::StepMetrics sm = rl::train_step(*ps, opt, rank.ep, mb, lc, ac, progress.step("grpo", step, steps));
      std::string line = sm.to_json(step++);
      line.pop_back();
      line += ",\"iteration\":" + std::to_string(iteration) + ",\"mean_reward\":" +
              io::json_float(mean_reward) + ",\"groups\":" + std::to_string(num_groups) +
              ",\"skipped_groups\":" + std::to_string(skipped_groups) +
              ",\"overlong_filtered\":" + std::to_string(overlong_filtered) +
              (o.kl_in_reward ? ",\"reward_kl\":" + io::json_float(reward_kl / std::max(1.0, reward_kl_tokens))
                              : std::string()) +
              "}";
      emit_metrics(rank.ep, metrics, line);
    }
  }
  io::save_checkpoint(out, *ps, opt, rank.ep,
                      "{\"kind\":\"grpo\",\"iteration\":" + std::to_string(iteration) + "}");
  wait_until_stored(rank);
  return 0;
}

struct BenchOptions {
  int size = 1024, repeats = 5;
  std::string file;
};

int cmd_sgemm(const BenchOptions& o) {
  const int n = o.size, repeats = o.repeats;
  std::vector<float> A((size_t)n * n, 0.5f), B((size_t)n * n, 0.25f), C((size_t)n * n);
  std::vector<double> gflops;
  for (int r = 0; r < repeats + 1; r++) {  // first run warms up
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A.data(), n, B.data(), n,
                0.0f, C.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) gflops.push_back(2.0 * n * n * (double)n / s / 1e9);
  }
  std::sort(gflops.begin(), gflops.end());
  std::printf("{\"sgemm_size\":%d,\"sgemm_gflops\":%.3f,\"sgemm_gflops_best\":%.3f,"
              "\"blas_core\":\"%s\"}\n",
              n, gflops[gflops.size() / 2], gflops.back(), model::blas_core());
  return 0;
}

// Hashes a file `repeats` times (after one warm-up read that brings it into the page cache):
// the checkpoint save/load cost per byte.
int cmd_sha256(const BenchOptions& o) {
  const std::string& file = o.file;
  const int repeats = o.repeats;
  uint64_t bytes = 0;
  std::string digest = io::sha256_file(file, &bytes);
  std::vector<double> seconds;
  for (int r = 0; r < repeats; r++) {
    auto t0 = std::chrono::steady_clock::now();
    MOERL_CHECK(io::sha256_file(file) == digest, file, " changed while it was being hashed");
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  double median = seconds[seconds.size() / 2];
  std::printf("{\"sha256_bytes\":%llu,\"sha256_seconds\":%.4f,\"sha256_mb_per_s\":%.1f,\"sha256\":\"%s\"}\n",
              (unsigned long long)bytes, median, bytes / 1e6 / median, digest.c_str());
  return 0;
}

}  // namespace
}  // namespace moerl::tools

int main(int argc, char** argv) {
  using namespace moerl::tools;
  CLI::App app{"Creates, SFT-trains and GRPO-trains the MoE policy; one process per EP rank.",
               "moe_train"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  InitOptions init;
  SftOptions sft;
  GrpoOptions grpo;
  BenchOptions sgemm, sha;
  CLI::App* init_cmd =
      app.add_subcommand("init", "write a randomly initialised or Hugging Face imported checkpoint");
  add_init_options(init_cmd, init);
  CLI::App* sft_cmd = app.add_subcommand("sft", "supervised fine-tuning on a task or a JSONL file");
  add_sft_options(sft_cmd, sft);
  CLI::App* grpo_cmd = app.add_subcommand("grpo", "GRPO steps on scored rollouts");
  add_grpo_options(grpo_cmd, grpo);
  CLI::App* sgemm_cmd = app.add_subcommand("sgemm", "OpenBLAS sgemm GFLOP/s, median and best");
  sgemm_cmd->add_option("--size", sgemm.size, "matrix size n (n x n times n x n)")
      ->check(kPositive);
  sgemm_cmd->add_option("--repeats", sgemm.repeats, "timed runs")->check(kPositive);
  CLI::App* sha_cmd = app.add_subcommand("sha256", "sha256 of a file: median seconds and MB/s");
  sha_cmd->add_option("--file", sha.file, "file to hash")->required();
  sha_cmd->add_option("--repeats", sha.repeats, "timed runs")->check(kPositive);
  return run_tool(app, argc, argv, [&] {
    if (*init_cmd) return cmd_init(init);
    if (*sft_cmd || *grpo_cmd) keep_freed_memory();
    if (*sft_cmd) return cmd_sft(sft);
    if (*grpo_cmd) return cmd_grpo(grpo);
    if (*sgemm_cmd) return cmd_sgemm(sgemm);
    if (*sha_cmd) return cmd_sha256(sha);
    MOERL_FAIL(BadInput, "give a command: init, sft, grpo, sgemm or sha256 (see moe_train --help)");
  });
}
