// moe_train: create, SFT-train and GRPO-train the MoE policy; one process per EP rank.
//
//   moe_train init  --out DIR [--seed S] [--dim 128 --layers 2 --heads 4 --experts 8
//                   --top-k 2 --expert-dim 128 --max-seq-len 32]
//   moe_train sft   --checkpoint DIR --out DIR --task add|--data FILE [--steps 200 ...]
//   moe_train grpo  --checkpoint DIR --out DIR --rollouts F1,F2 --rewards R1,R2 [...]
//   moe_train sgemm [--size 1024 --repeats 5]      (OpenBLAS sgemm GFLOP/s: median and best)
//
// Rank contract: MOERL_RANK, MOERL_WORLD_SIZE, MOERL_COORDINATOR, MOERL_FI_PROVIDER.
// Exit 0 done, 2 bad input (do not retry), anything else retryable. Metrics: one JSON
// object per optimizer step on stdout (rank 0) and appended to --metrics if given.
#include <cblas.h>  // cblas_sgemm for the sgemm benchmark

#include <algorithm>  // std::min
#include <chrono>     // steady_clock
#include <cmath>      // std::sqrt
#include <cstdio>     // std::printf
#include <fstream>    // metrics file
#include <map>
#include <memory>
#include <sstream>

#include "common/check.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "io/sha256.h"
#include "model/expert_comm.h"
#include "model/weights.h"
#include "rl/trainer.h"
#include "tasks/tasks.h"
#include "tasks/tokenizer.h"
#include "tools/moe_cli.h"
#include "transport/communicator.h"

namespace moerl::tools {
namespace {

struct Rank {
  transport::Communicator comm;
  model::ExpertComm ep;
  Rank(const transport::Config& c, int num_experts) : comm(c), ep(comm, num_experts) {}
};

std::unique_ptr<model::ParamStore> make_store(const model::ModelConfig& cfg, model::ExpertComm& ep) {
  return std::make_unique<model::ParamStore>(
      model::make_layout(cfg, ep.first_expert(), ep.num_local_experts()));
}

void emit_metrics(model::ExpertComm& ep, const std::string& path, const std::string& line) {
  if (ep.rank() != 0) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (path.empty()) return;
  std::ofstream out(path, std::ios::app);
  MOERL_CHECK_INPUT(out.good(), "cannot append to metrics file ", path);
  out << line << "\n";
}

rl::AdamWConfig adamw_from(const Args& a, double lr, int64_t decay_steps) {
  rl::AdamWConfig c;
  c.lr = (float)a.number("lr", lr);
  c.weight_decay = (float)a.number("weight-decay", 0.0);
  c.grad_clip = (float)a.number("grad-clip", 1.0);
  c.warmup_steps = a.integer("warmup-steps", 0);
  c.decay_steps = a.integer("decay-steps", decay_steps);
  c.min_lr_ratio = (float)a.number("min-lr-ratio", 0.1);
  c.beta2 = (float)a.number("beta2", 0.95);
  return c;
}

rl::LossConfig loss_from(const Args& a, rl::Objective obj) {
  rl::LossConfig c;
  c.objective = obj;
  c.clip_eps = (float)a.number("clip-eps", 0.2);
  c.kl_coef = (float)a.number("kl-coef", 0.0);
  c.entropy_coef = (float)a.number("entropy-coef", 0.0);
  c.aux_coef = (float)a.number("aux-coef", 0.01);
  c.z_coef = (float)a.number("z-coef", 0.001);
  c.temperature = (float)a.number("temperature", 1.0);
  c.micro_batch = (int)a.integer("micro-batch", 64);
  MOERL_CHECK_INPUT(c.micro_batch > 0, "--micro-batch must be > 0");
  MOERL_CHECK_INPUT(c.temperature > 0.0f, "--temperature must be > 0 for training");
  return c;
}

int cmd_init(const Args& a) {
  model::ModelConfig cfg;
  cfg.vocab_size = (int)a.integer("vocab-size", tasks::kVocabSize);
  cfg.max_seq_len = (int)a.integer("max-seq-len", 32);
  cfg.dim = (int)a.integer("dim", 128);
  cfg.num_layers = (int)a.integer("layers", 2);
  cfg.num_heads = (int)a.integer("heads", 4);
  cfg.num_experts = (int)a.integer("experts", 8);
  cfg.top_k = (int)a.integer("top-k", 2);
  cfg.expert_dim = (int)a.integer("expert-dim", 128);
  uint64_t seed = (uint64_t)a.integer("seed", 0);
  std::string out = a.required("out");
  a.check_all_used();
  model::validate(cfg);
  Rank rank(transport::Config::from_env(), cfg.num_experts);
  auto ps = make_store(cfg, rank.ep);
  ps->init_random(seed);
  io::OptimizerState opt;
  opt.reset(ps->layout);
  io::save_checkpoint(out, *ps, opt, rank.ep, "{\"kind\":\"init\",\"seed\":" + std::to_string(seed) + "}");
  size_t params = ps->layout.dense_numel + ps->layout.expert_numel * rank.ep.world_size();
  if (rank.ep.rank() == 0)
    std::printf("{\"done\":true,\"out\":%s,\"parameters\":%zu,\"config\":%s}\n",
                io::json_quote(out).c_str(), params, model::config_to_json(cfg).c_str());
  return 0;
}

int cmd_sft(const Args& a) {
  std::string in = a.required("checkpoint"), out = a.required("out");
  std::string task = a.str("task", ""), data = a.str("data", "");
  MOERL_CHECK_INPUT(task.empty() != data.empty(), "give exactly one of --task (built-in) and --data "
                    "(JSONL of {\"prompt\":..,\"answer\":..})");
  if (!task.empty()) tasks::check_task(task);
  int64_t steps = a.integer("steps", 200), batch_size = a.integer("batch-size", 64);
  uint64_t seed = (uint64_t)a.integer("seed", 0);
  int64_t first_prompt = a.integer("first-prompt", 0);
  std::string metrics = a.str("metrics", "");
  rl::LossConfig lc = loss_from(a, rl::Objective::Sft);
  rl::AdamWConfig ac = adamw_from(a, 3e-3, steps);
  a.check_all_used();
  MOERL_CHECK_INPUT(steps > 0 && batch_size > 0, "--steps and --batch-size must be > 0");

  std::vector<tasks::Prompt> examples;  // --data: cycled through in file order
  if (!data.empty()) {
    io::for_each_json_line(data, [&](const io::Json& j, const std::string& what) {
      examples.push_back({(int64_t)examples.size(), io::string_field(j, "prompt", what),
                          io::string_field(j, "answer", what)});
    });
    MOERL_CHECK_INPUT(!examples.empty(), data, " holds no examples");
  }

  model::ModelConfig cfg = io::read_checkpoint_config(in);
  Rank rank(transport::Config::from_env(), cfg.num_experts);
  auto ps = make_store(cfg, rank.ep);
  io::OptimizerState opt;
  io::load_checkpoint(in, *ps, opt);
  ac.decay_steps = a.integer("decay-steps", steps);
  ac.schedule_start = opt.step;
  for (int64_t s = 0; s < steps; s++) {
    std::vector<rl::TrainSequence> batch;
    for (int64_t i = 0; i < batch_size; i++) {
      int64_t id = first_prompt + s * batch_size + i;
      tasks::Prompt p = examples.empty() ? tasks::make_prompt(task, tasks::Split::Train, seed, id)
                                         : examples[(size_t)(id % (int64_t)examples.size())];
      rl::TrainSequence seq;
      seq.tokens = tasks::encode(p.text);
      seq.prompt_len = (int)seq.tokens.size();
      for (int32_t t : tasks::encode(p.answer)) seq.tokens.push_back(t);
      seq.tokens.push_back(tasks::kEos);
      batch.push_back(std::move(seq));
    }
    rl::StepMetrics m = rl::train_step(*ps, opt, rank.ep, batch, lc, ac);
    emit_metrics(rank.ep, metrics, m.to_json(s));
  }
  io::save_checkpoint(out, *ps, opt, rank.ep,
                      "{\"kind\":\"sft\",\"task\":" + io::json_quote(task.empty() ? data : task) + "}");
  return 0;
}

int cmd_grpo(const Args& a) {
  std::string in = a.required("checkpoint"), out = a.required("out");
  std::vector<std::string> rollout_files = a.list("rollouts"), reward_files = a.list("rewards");
  MOERL_CHECK_INPUT(!rollout_files.empty(), "missing required flag --rollouts (comma-separated files)");
  MOERL_CHECK_INPUT(!reward_files.empty(), "missing required flag --rewards (comma-separated files)");
  std::string ref = a.str("ref-checkpoint", "");
  std::string metrics = a.str("metrics", "");
  int64_t iteration = a.integer("iteration", 0);
  int64_t minibatches = a.integer("minibatches", 1), epochs = a.integer("epochs", 1);
  rl::LossConfig lc = loss_from(a, rl::Objective::Grpo);
  rl::AdamWConfig ac = adamw_from(a, 1e-3, 0);
  a.check_all_used();
  MOERL_CHECK_INPUT(minibatches > 0 && epochs > 0, "--minibatches and --epochs must be > 0");
  MOERL_CHECK_INPUT(lc.kl_coef == 0.0f || !ref.empty(), "--kl-coef > 0 needs --ref-checkpoint");

  // rewards: (prompt id, sample index) -> reward
  std::map<std::pair<int64_t, int64_t>, float> rewards;
  for (const std::string& path : reward_files) {
    MOERL_CHECK_INPUT(std::ifstream(path).good(), "cannot open rewards file ", path);
    io::for_each_json_line(path, [&](const io::Json& j, const std::string& what) {
      rewards[{io::integer_field(j, "prompt_id", what), io::integer_field(j, "sample_index", what)}] =
          (float)io::number_field(j, "reward", what);
    });
  }
  std::vector<RolloutRecord> rollouts = read_rollouts(rollout_files);
  std::sort(rollouts.begin(), rollouts.end(), [](const RolloutRecord& x, const RolloutRecord& y) {
    return std::make_pair(x.prompt_id, x.sample_index) < std::make_pair(y.prompt_id, y.sample_index);
  });

  // group-normalised advantages; groups whose rewards are all equal carry no signal and
  // are skipped (as DAPO's dynamic sampling does)
  std::vector<rl::TrainSequence> seqs;
  double reward_sum = 0.0;
  int64_t skipped_groups = 0, groups = 0;
  for (size_t i = 0; i < rollouts.size();) {
    size_t j = i;
    while (j < rollouts.size() && rollouts[j].prompt_id == rollouts[i].prompt_id) j++;
    groups++;
    std::vector<float> r;
    for (size_t k = i; k < j; k++) {
      auto it = rewards.find({rollouts[k].prompt_id, rollouts[k].sample_index});
      MOERL_CHECK_INPUT(it != rewards.end(), "no reward for prompt ", rollouts[k].prompt_id,
                        " sample ", rollouts[k].sample_index);
      r.push_back(it->second);
      reward_sum += it->second;
    }
    double mean = 0.0, var = 0.0;
    for (float x : r) mean += x / r.size();
    for (float x : r) var += (x - mean) * (x - mean) / r.size();
    double sd = std::sqrt(var);
    if (sd < 1e-6) {
      skipped_groups++;
    } else {
      for (size_t k = i; k < j; k++) {
        const RolloutRecord& ro = rollouts[k];
        if (ro.tokens.empty()) continue;
        rl::TrainSequence s;
        s.tokens = ro.prompt_tokens;
        s.prompt_len = (int)s.tokens.size();
        s.tokens.insert(s.tokens.end(), ro.tokens.begin(), ro.tokens.end());
        s.old_logprobs = ro.logprobs;
        s.advantage = (float)((r[k - i] - mean) / (sd + 1e-6));
        seqs.push_back(std::move(s));
      }
    }
    i = j;
  }

  model::ModelConfig cfg = io::read_checkpoint_config(in);
  Rank rank(transport::Config::from_env(), cfg.num_experts);
  auto ps = make_store(cfg, rank.ep);
  io::OptimizerState opt;
  io::load_checkpoint(in, *ps, opt);
  // minibatch m holds sequences i with i % minibatches == m
  std::vector<std::vector<rl::TrainSequence>> mbs(minibatches);
  for (size_t i = 0; i < seqs.size(); i++) mbs[i % minibatches].push_back(seqs[i]);
  if (lc.kl_coef != 0.0f && !seqs.empty()) {
    auto ref_ps = make_store(cfg, rank.ep);
    io::OptimizerState ref_opt;
    io::load_checkpoint(ref, *ref_ps, ref_opt);
    // per minibatch, so each rank fills exactly the share train_step will give it
    for (auto& mb : mbs)
      if (!mb.empty()) rl::fill_ref_logprobs(*ref_ps, rank.ep, mb, lc);
  }
  double mean_reward = rollouts.empty() ? 0.0 : reward_sum / rollouts.size();
  int64_t step = 0;
  if (seqs.empty()) {
    emit_metrics(rank.ep, metrics,
                 "{\"iteration\":" + std::to_string(iteration) + ",\"skipped\":true,\"mean_reward\":" +
                     io::json_float(mean_reward) + ",\"groups\":" + std::to_string(groups) + "}");
  }
  for (int64_t e = 0; e < epochs && !seqs.empty(); e++) {
    for (int64_t m = 0; m < minibatches; m++) {
      const std::vector<rl::TrainSequence>& mb = mbs[m];
      if (mb.empty()) continue;
      rl::StepMetrics sm = rl::train_step(*ps, opt, rank.ep, mb, lc, ac);
      std::string line = sm.to_json(step++);
      line.pop_back();
      line += ",\"iteration\":" + std::to_string(iteration) + ",\"mean_reward\":" +
              io::json_float(mean_reward) + ",\"groups\":" + std::to_string(groups) +
              ",\"skipped_groups\":" + std::to_string(skipped_groups) + "}";
      emit_metrics(rank.ep, metrics, line);
    }
  }
  io::save_checkpoint(out, *ps, opt, rank.ep,
                      "{\"kind\":\"grpo\",\"iteration\":" + std::to_string(iteration) + "}");
  return 0;
}

int cmd_sgemm(const Args& a) {
  int n = (int)a.integer("size", 1024), repeats = (int)a.integer("repeats", 5);
  a.check_all_used();
  MOERL_CHECK_INPUT(n > 0 && repeats > 0, "--size and --repeats must be > 0");
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
  std::printf("{\"sgemm_size\":%d,\"sgemm_gflops\":%.3f,\"sgemm_gflops_best\":%.3f}\n", n,
              gflops[gflops.size() / 2], gflops.back());
  return 0;
}

// Hashes a file `repeats` times (after one warm-up read that brings it into the page cache):
// the checkpoint save/load cost per byte.
int cmd_sha256(const Args& a) {
  std::string file = a.required("file");
  int repeats = (int)a.integer("repeats", 5);
  a.check_all_used();
  MOERL_CHECK_INPUT(repeats > 0, "--repeats must be > 0");
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
  return run_tool("moe_train", [&] {
    MOERL_CHECK_INPUT(argc >= 2, "usage: moe_train init|sft|grpo|sgemm --flag value ...");
    std::string cmd = argv[1];
    Args a(argc, argv, 2);
    if (cmd == "init") return cmd_init(a);
    if (cmd == "sft") return cmd_sft(a);
    if (cmd == "grpo") return cmd_grpo(a);
    if (cmd == "sgemm") return cmd_sgemm(a);
    if (cmd == "sha256") return cmd_sha256(a);
    MOERL_FAIL(BadInput, "unknown command \"", cmd, "\"; use init, sft, grpo or sgemm");
  });
}
