// moe_generate: sample completions from a policy checkpoint for a range of prompts of a
// built-in task (or of a prompts file), writing one JSONL file per chunk of prompts.
//
//   moe_generate --checkpoint DIR --task add --out-dir DIR [--split train|eval] [--seed S]
//                [--iteration I] [--first-prompt 0] [--num-prompts 64] [--samples 8]
//                [--chunk-size 16] [--start-chunk 0] [--temperature 1] [--top-p 1]
//                [--top-k 0] [--max-new-tokens 16] [--no-kv-cache] [--ignore-eos]
//                [--prompts FILE]
//
// --prompts FILE: JSONL lines {"prompt_id":p,"prompt":"text"} replace the built-in generator
// (a dataset task); --first-prompt/--num-prompts then index lines of the file and --task is
// only copied into the records.
//
// Chunk k holds prompts first+k*chunk .. first+(k+1)*chunk-1, every sample of each, and is
// written to <out-dir>/chunk-<k>.jsonl (atomically). Sample s of prompt p is seeded by
// (seed, iteration, p, s), so a chunk regenerated after a retry is bit-identical.
// After each chunk one JSON progress line goes to stdout: {"chunk":k,"done":true,...}.
// Runs on one process (all experts local): the EP core with world size 1.
#include <algorithm>  // std::min, std::max
#include <chrono>   // steady_clock
#include <cstdio>   // std::printf
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "model/expert_comm.h"
#include "model/sampler.h"
#include "tasks/tasks.h"
#include "tasks/tokenizer.h"
#include "tools/moe_cli.h"
#include "transport/communicator.h"

namespace moerl::tools {
namespace {

int run(const Args& a) {
  std::string ckpt = a.required("checkpoint"), out_dir = a.required("out-dir");
  std::string task = a.required("task");
  std::string prompts_file = a.str("prompts", "");
  if (prompts_file.empty()) tasks::check_task(task);
  std::string split_name = a.str("split", "train");
  MOERL_CHECK_INPUT(split_name == "train" || split_name == "eval", "--split must be train or eval, got ",
                    split_name);
  tasks::Split split = split_name == "eval" ? tasks::Split::Eval : tasks::Split::Train;
  uint64_t seed = (uint64_t)a.integer("seed", 0);
  int64_t iteration = a.integer("iteration", 0);
  int64_t first = a.integer("first-prompt", 0), num_prompts = a.integer("num-prompts", 64);
  int64_t samples = a.integer("samples", 8), chunk = a.integer("chunk-size", 16);
  int64_t start_chunk = a.integer("start-chunk", 0);
  model::SampleParams sp;
  sp.temperature = (float)a.number("temperature", 1.0);
  sp.top_p = (float)a.number("top-p", 1.0);
  sp.top_k = (int)a.integer("top-k", 0);
  sp.max_new_tokens = (int)a.integer("max-new-tokens", 16);
  sp.eos_id = tasks::kEos;
  sp.use_kv_cache = !a.flag("no-kv-cache");
  if (a.flag("ignore-eos")) sp.eos_id = -1;  // benchmark: always generate max-new-tokens
  a.check_all_used();
  MOERL_CHECK_INPUT(first >= 0 && num_prompts > 0 && samples > 0 && chunk > 0 && start_chunk >= 0,
                    "--first-prompt >= 0, --num-prompts, --samples, --chunk-size > 0 and "
                    "--start-chunk >= 0 required");
  MOERL_CHECK_INPUT(sp.top_p > 0.0f && sp.top_p <= 1.0f, "--top-p must be in (0, 1]");
  MOERL_CHECK_INPUT(sp.max_new_tokens > 0, "--max-new-tokens must be > 0");

  model::ModelConfig cfg = io::read_checkpoint_config(ckpt);
  transport::Config tcfg;  // generation is single-process: world size 1, no network
  transport::Communicator comm(tcfg);
  model::ExpertComm ep(comm, cfg.num_experts);
  model::ParamStore ps(model::make_layout(cfg, 0, cfg.num_experts));
  io::OptimizerState opt;
  io::load_checkpoint(ckpt, ps, opt);

  std::vector<tasks::Prompt> file_prompts;
  if (!prompts_file.empty()) {
    io::for_each_json_line(prompts_file, [&](const io::Json& j, const std::string& what) {
      tasks::Prompt p;
      p.prompt_id = io::integer_field(j, "prompt_id", what);
      p.text = io::string_field(j, "prompt", what);
      tasks::encode(p.text);  // BadInput now, naming the character, rather than mid-run
      file_prompts.push_back(p);
    });
    MOERL_CHECK_INPUT(first + num_prompts <= (int64_t)file_prompts.size(), prompts_file, " has ",
                      file_prompts.size(), " prompts; --first-prompt + --num-prompts is ",
                      first + num_prompts);
  }
  io::make_dirs(out_dir);
  const int64_t num_chunks = (num_prompts + chunk - 1) / chunk;
  MOERL_CHECK_INPUT(start_chunk <= num_chunks, "--start-chunk ", start_chunk, " beyond the ",
                    num_chunks, " chunks");
  int64_t total_tokens = 0;
  double total_s = 0.0;
  for (int64_t k = start_chunk; k < num_chunks; k++) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<tasks::Prompt> prompts;
    std::vector<model::SampleRequest> reqs;
    for (int64_t p = first + k * chunk; p < std::min(first + (k + 1) * chunk, first + num_prompts); p++) {
      prompts.push_back(file_prompts.empty() ? tasks::make_prompt(task, split, seed, p)
                                             : file_prompts[p]);
      for (int64_t s = 0; s < samples; s++)
        reqs.push_back({tasks::encode(prompts.back().text),
                        model::sample_seed(seed, (uint64_t)iteration,
                                           (uint64_t)prompts.back().prompt_id, (uint64_t)s)});
    }
    std::vector<model::SampleResult> res;
    model::generate(ps, ep, reqs, sp, res);
    std::ostringstream os;
    int64_t chunk_tokens = 0, stopped = 0;
    for (size_t i = 0; i < res.size(); i++) {
      const tasks::Prompt& pr = prompts[i / samples];
      RolloutRecord r;
      r.prompt_id = pr.prompt_id;
      r.sample_index = (int64_t)(i % samples);
      r.iteration = iteration;
      r.task = task;
      r.prompt = pr.text;
      r.prompt_tokens = reqs[i].prompt;
      r.tokens = res[i].tokens;
      r.text = tasks::decode(res[i].tokens);
      r.logprobs = res[i].logprobs;
      r.finish_reason = res[i].stopped ? "stop" : "length";
      chunk_tokens += (int64_t)r.tokens.size();
      stopped += res[i].stopped;
      os << rollout_to_json(r) << "\n";
    }
    io::write_file_atomic(out_dir + "/chunk-" + std::to_string(k) + ".jsonl", os.str());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_tokens += chunk_tokens;
    total_s += s;
    std::printf("{\"chunk\":%lld,\"done\":true,\"samples\":%zu,\"new_tokens\":%lld,\"stopped\":%lld,"
                "\"seconds\":%.4f,\"tokens_per_s\":%.1f}\n",
                (long long)k, res.size(), (long long)chunk_tokens, (long long)stopped, s,
                chunk_tokens / std::max(s, 1e-9));
    std::fflush(stdout);
  }
  std::printf("{\"done\":true,\"chunks\":%lld,\"new_tokens\":%lld,\"seconds\":%.4f,\"tokens_per_s\":%.1f}\n",
              (long long)(num_chunks - start_chunk), (long long)total_tokens, total_s,
              total_tokens / std::max(total_s, 1e-9));
  return 0;
}

}  // namespace
}  // namespace moerl::tools

int main(int argc, char** argv) {
  using namespace moerl::tools;
  return run_tool("moe_generate", [&] { return run(Args(argc, argv, 1, {"no-kv-cache", "ignore-eos"})); });
}
