// moe_generate: sample completions from a policy checkpoint for a range of prompts of a
// built-in task (or of a prompts file), writing one JSONL file per chunk of prompts.
//
//   moe_generate --checkpoint DIR --task add --out-dir DIR [--split train|eval] [--seed S]
//                [--iteration I] [--first-prompt 0] [--num-prompts 64] [--samples 8]
//                [--chunk-size 16] [--start-chunk 0] [--temperature 1] [--top-p 1]
//                [--top-k 0] [--max-new-tokens 16] [--no-kv-cache] [--ignore-eos]
//                [--prompts FILE] [--ep-mode auto|ll|normal] [--max-batch 0] [--wait-stored]
//                                                                  (--help lists them all)
//
// --max-batch B: at most B samples per rank decode at once (continuous batching: a finished
// sample's slot takes the rank's next sample of the chunk at the next step); the KV cache and
// the low-latency slots are sized for B rows instead of the rank's whole share. 0 = all.
//
// --prompts FILE: JSONL lines {"prompt_id":p,"prompt":"text"} replace the built-in generator
// (a dataset task); {"prompt_id":p,"prompt_tokens":[ids]} give token ids of the model's own
// tokenizer instead (a Hugging Face model: then --eos-ids, and records carry no text); --first-prompt/--num-prompts then index lines of the file and --task is
// only copied into the records.
//
// Chunk k holds prompts first+k*chunk .. first+(k+1)*chunk-1, every sample of each, and is
// written to <out-dir>/chunk-<k>.jsonl (atomically). Sample s of prompt p is seeded by
// (seed, iteration, p, s), so a chunk regenerated after a retry is bit-identical.
// stdout, one JSON object per line:
//   {"chunk":k,"progress":true,"step":t,"steps":T,"tokens":n}  while chunk k is generated, at
//       most about once per second: t decode steps done of T = --max-new-tokens (t counts the
//       furthest sample's new tokens), n new tokens of the chunk so far
//   {"chunk":k,"done":true,"samples":n,"new_tokens":n,"stopped":n,"seconds":s,"tokens_per_s":x}
//       once chunk k's file is written
//   {"done":true,"chunks":n,"new_tokens":n,"seconds":s,"tokens_per_s":x,...}  at the end
//       (also the decode-loop seconds, decode_steps and kv_cache_bytes: rank 0's largest KV
//       cache)
// --wait-stored: rank 0 reads the line "stored" on stdin after each chunk's done line (the
// caller has put the chunk in the store) before any rank starts the next chunk, so a lost
// worker loses at most the chunk in flight, however slow its uploads; without it the ranks
// run ahead of the caller.
// Exit 0 done (or --help), 2 bad input, 1 anything else (retryable).
//
// Expert parallel on R ranks under the rank contract of moe_train (MOERL_RANK,
// MOERL_WORLD_SIZE, MOERL_COORDINATOR, MOERL_FI_PROVIDER; none set: one rank): every rank
// gets the same flags, holds the dense weights and experts [r*E/R, (r+1)*E/R), and generates
// a contiguous share of each chunk's samples; each MoE layer of each decode step is one
// collective dispatch + combine (--ep-mode: ll = low-latency buffer, the default on R > 1;
// normal = ep::Buffer, the default on one rank, whose output it leaves unchanged). Rank 0
// gathers the chunk, writes the file and prints the lines above, so the file format and
// --start-chunk resumption do not depend on R. Samples stay seeded by (seed, iteration,
// prompt id, sample index); with ll, tokens and log-probs do not depend on R either as long
// as the GEMMs round a row the same whatever the batch (docs/native-model.md).
#include <algorithm>  // std::min, std::max
#include <chrono>   // steady_clock
#include <cstdio>   // std::printf
#include <cstring>  // std::memcpy for log-prob bits
#include <iostream>  // std::cin for --wait-stored
#include <memory>   // std::unique_ptr for the MoE exchange
#include <sstream>  // std::ostringstream

#include "common/check.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "model/expert_comm.h"
#include "model/moe_decode.h"
#include "model/sampler.h"
#include "tasks/tasks.h"
#include "tasks/tokenizer.h"
#include "tools/moe_cli.h"
#include "transport/communicator.h"

namespace moerl::tools {
namespace {

struct Options {
  std::string checkpoint, out_dir, task, prompts_file, split = "train", ep_mode = "auto";
  uint64_t seed = 0;
  int64_t iteration = 0, first = 0, num_prompts = 64, samples = 8, chunk = 16, start_chunk = 0;
  bool no_kv_cache = false, ignore_eos = false, wait_stored = false;
  std::vector<int32_t> eos_ids;
  double progress_interval = 1.0;
  model::SampleParams sp;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--checkpoint", o.checkpoint, "policy checkpoint directory")->required();
  app.add_option("--task", o.task, "built-in task (add, sort, reverse), or any name with --prompts")
      ->required();
  app.add_option("--out-dir", o.out_dir, "directory for chunk-<k>.jsonl")->required();
  app.add_option("--prompts", o.prompts_file, "JSONL of {\"prompt_id\":p,\"prompt\":\"text\"}");
  app.add_option("--split", o.split, "prompt split of a built-in task")
      ->check(CLI::IsMember({"train", "eval"}));
  app.add_option("--seed", o.seed, "campaign seed (prompts and samples)");
  app.add_option("--iteration", o.iteration, "iteration (part of each sample's seed)");
  app.add_option("--first-prompt", o.first, "first prompt id (or line of --prompts)")
      ->check(kNonNegative);
  app.add_option("--num-prompts", o.num_prompts, "prompts to generate for")->check(kPositive);
  app.add_option("--samples", o.samples, "samples per prompt")->check(kPositive);
  app.add_option("--chunk-size", o.chunk, "prompts per chunk file")->check(kPositive);
  app.add_option("--start-chunk", o.start_chunk, "first chunk to generate (resume)")
      ->check(kNonNegative);
  app.add_option("--temperature", o.sp.temperature, "sampling temperature, 0 = greedy")
      ->check(kNonNegative);
  app.add_option("--top-p", o.sp.top_p, "nucleus mass, in (0, 1]");
  app.add_option("--top-k", o.sp.top_k, "keep the k most likely tokens, 0 = all")
      ->check(kNonNegative);
  app.add_option("--max-new-tokens", o.sp.max_new_tokens, "tokens to generate per sample at most")
      ->check(kPositive);
  app.add_flag("--no-kv-cache", o.no_kv_cache, "recompute the prefix every step (benchmark only)");
  app.add_flag("--ignore-eos", o.ignore_eos, "always generate --max-new-tokens (benchmark only)");
  app.add_flag("--wait-stored", o.wait_stored,
               "before each next chunk, wait for a line \"stored\" on stdin (rank 0)");
  app.add_option("--eos-ids", o.eos_ids, "stop token ids of the model's own tokenizer (default: "
                 "the built-in tokenizer's <eos>)")->delimiter(',');
  app.add_option("--progress-interval", o.progress_interval, "seconds between progress lines")
      ->check(kNonNegative);
  app.add_option("--ep-mode", o.ep_mode,
                 "MoE exchange: ll (low-latency), normal, auto = normal on 1 rank, ll on more")
      ->check(CLI::IsMember({"auto", "ll", "normal"}));
  app.add_option("--max-batch", o.sp.max_batch,
                 "samples per rank decoding at once (continuous batching), 0 = the whole share")
      ->check(kNonNegative);
}

// This rank's results, flattened for the gather to rank 0: per sample [n, stopped,
// tokens[n], logprobs[n] as bits], int32 words.
std::vector<int32_t> pack_results(const std::vector<model::SampleResult>& res) {
  std::vector<int32_t> w;
  for (const model::SampleResult& r : res) {
    w.push_back((int32_t)r.tokens.size());
    w.push_back(r.stopped ? 1 : 0);
    w.insert(w.end(), r.tokens.begin(), r.tokens.end());
    for (float lp : r.logprobs) {
      int32_t bits;
      std::memcpy(&bits, &lp, sizeof bits);
      w.push_back(bits);
    }
  }
  return w;
}

// Rank 0: every rank's results in rank order (ranks hold contiguous shares of the chunk).
std::vector<model::SampleResult> gather_results(transport::Communicator& comm,
                                                const std::vector<model::SampleResult>& mine,
                                                const std::vector<int64_t>& counts) {
  const int R = comm.world_size();
  if (R == 1) return mine;
  std::vector<int32_t> words = pack_results(mine);
  // gather takes equal sizes: agree on the longest, pad to it
  uint64_t size = words.size(), longest = 0;
  std::vector<uint64_t> sizes(comm.rank() == 0 ? R : 0);
  comm.gather(&size, sizeof size, sizes.data(), 0);
  if (comm.rank() == 0) longest = *std::max_element(sizes.begin(), sizes.end());
  comm.broadcast(&longest, sizeof longest, 0);
  words.resize(longest, 0);
  std::vector<int32_t> all(comm.rank() == 0 ? (size_t)R * longest : 0);
  comm.gather(words.data(), longest * sizeof(int32_t), all.data(), 0);
  std::vector<model::SampleResult> out;
  if (comm.rank() != 0) return out;
  for (int r = 0; r < R; r++) {
    const int32_t* w = all.data() + (size_t)r * longest;
    for (int64_t i = 0; i < counts[r]; i++) {
      model::SampleResult s;
      const int32_t n = *w++;
      s.stopped = *w++ != 0;
      s.tokens.assign(w, w + n);
      w += n;
      s.logprobs.resize(n);
      std::memcpy(s.logprobs.data(), w, (size_t)n * sizeof(float));
      w += n;
      out.push_back(std::move(s));
    }
  }
  return out;
}

// --wait-stored: the caller's line saying chunk k is in the store.
void wait_for_stored_line(int64_t k) {
  std::string line;
  if (!std::getline(std::cin, line))
    MOERL_FAIL(Internal, "--wait-stored: stdin closed before chunk ", k, " was stored");
  MOERL_CHECK(line == "stored", "--wait-stored: got \"", line, "\" on stdin after chunk ", k,
              ", expected \"stored\"");
}

int run(Options& o) {
  const std::string &ckpt = o.checkpoint, &out_dir = o.out_dir, &task = o.task,
                    &prompts_file = o.prompts_file;
  if (prompts_file.empty()) tasks::check_task(task);
  tasks::Split split = o.split == "eval" ? tasks::Split::Eval : tasks::Split::Train;
  const uint64_t seed = o.seed;
  const int64_t iteration = o.iteration, first = o.first, num_prompts = o.num_prompts,
                samples = o.samples, chunk = o.chunk, start_chunk = o.start_chunk;
  model::SampleParams& sp = o.sp;
  // stop ids: the built-in tokenizer's <eos>, or a model's own (--eos-ids); none: never early
  sp.eos_ids = o.eos_ids.empty() ? std::vector<int32_t>{tasks::kEos} : o.eos_ids;
  if (o.ignore_eos) sp.eos_ids.clear();
  sp.use_kv_cache = !o.no_kv_cache;
  MOERL_CHECK_INPUT(sp.top_p > 0.0f && sp.top_p <= 1.0f, "--top-p must be in (0, 1], got ", sp.top_p);

  model::ModelConfig cfg = io::read_checkpoint_config(ckpt);
  const transport::Config tcfg = transport::Config::from_env();
  MOERL_CHECK_INPUT(tcfg.world_size == 1 || !o.no_kv_cache, "--no-kv-cache runs on one rank ",
                    "only; MOERL_WORLD_SIZE is ", tcfg.world_size);
  transport::Communicator comm(tcfg);
  const int R = comm.world_size(), rank = comm.rank();
  const bool is_root = rank == 0;
  const std::string mode = o.ep_mode == "auto" ? (R == 1 ? "normal" : "ll") : o.ep_mode;
  model::ExpertComm ep(comm, cfg.num_experts);
  model::ParamStore ps(model::make_layout(cfg, ep.first_expert(), ep.num_local_experts()));
  io::load_weights(ckpt, ps);
  // The most rows one rank passes to a step (its share of a chunk, or the decode slots): the
  // low-latency slots' capacity.
  const int max_rows = model::decode_slots(sp, (int)((chunk * samples + R - 1) / R));
  std::unique_ptr<model::MoeDecode> moe;
  if (mode == "ll") moe = std::make_unique<model::LowLatencyMoeDecode>(comm, cfg, max_rows);
  else moe = std::make_unique<model::NormalMoeDecode>(ep);

  std::vector<tasks::Prompt> file_prompts;
  if (!prompts_file.empty()) {
    io::for_each_json_line(prompts_file, [&](const io::Json& j, const std::string& what) {
      tasks::Prompt p;
      p.prompt_id = io::integer_field(j, "prompt_id", what);
      if (j.contains("prompt_tokens")) {
        for (const io::Json& t : io::array_field(j, "prompt_tokens", what)) {
          p.tokens.push_back((int32_t)io::as_integer(t, what + " prompt_tokens"));
          MOERL_CHECK_INPUT(p.tokens.back() >= 0 && p.tokens.back() < cfg.vocab_size, what,
                            ": prompt token ", p.tokens.back(), " outside the vocabulary of ",
                            cfg.vocab_size);
        }
        MOERL_CHECK_INPUT(!o.eos_ids.empty() || o.ignore_eos, what, ": prompt_tokens come from a ",
                          "model's own tokenizer, so give its stop ids with --eos-ids");
        if (j.contains("prompt")) p.text = io::string_field(j, "prompt", what);
      } else {
        p.text = io::string_field(j, "prompt", what);
        tasks::encode(p.text);  // BadInput now, naming the character, rather than mid-run
      }
      file_prompts.push_back(p);
    });
    MOERL_CHECK_INPUT(first + num_prompts <= (int64_t)file_prompts.size(), prompts_file, " has ",
                      file_prompts.size(), " prompts; --first-prompt + --num-prompts is ",
                      first + num_prompts);
  }
  if (is_root) io::make_dirs(out_dir);
  const int64_t num_chunks = (num_prompts + chunk - 1) / chunk;
  MOERL_CHECK_INPUT(start_chunk <= num_chunks, "--start-chunk ", start_chunk, " beyond the ",
                    num_chunks, " chunks");
  int64_t total_tokens = 0, kv_bytes = 0, steps = 0;
  double total_s = 0.0, generate_s = 0.0;
  Progress progress(o.progress_interval);
  for (int64_t k = start_chunk; k < num_chunks; k++) {
    if (o.wait_stored && k > start_chunk) {
      if (is_root) wait_for_stored_line(k - 1);
      if (R > 1) comm.barrier(tcfg.startup_timeout_s);  // uploads can take minutes
    }
    auto t0 = std::chrono::steady_clock::now();
    std::vector<tasks::Prompt> prompts;
    std::vector<model::SampleRequest> reqs;
    for (int64_t p = first + k * chunk; p < std::min(first + (k + 1) * chunk, first + num_prompts); p++) {
      prompts.push_back(file_prompts.empty() ? tasks::make_prompt(task, split, seed, p)
                                             : file_prompts[p]);
      for (int64_t s = 0; s < samples; s++)
        reqs.push_back({prompts.back().tokens.empty() ? tasks::encode(prompts.back().text)
                                                      : prompts.back().tokens,
                        model::sample_seed(seed, (uint64_t)iteration,
                                           (uint64_t)prompts.back().prompt_id, (uint64_t)s)});
    }
    // rank r generates samples [S*r/R, S*(r+1)/R) of the chunk
    const int64_t S = (int64_t)reqs.size();
    std::vector<int64_t> counts(R);
    for (int r = 0; r < R; r++) counts[r] = S * (r + 1) / R - S * r / R;
    std::vector<model::SampleRequest> mine(reqs.begin() + S * rank / R,
                                           reqs.begin() + S * (rank + 1) / R);
    std::vector<model::SampleResult> res;
    kv_bytes =
        std::max(kv_bytes, model::kv_cache_bytes(cfg, model::decode_slots(sp, (int)mine.size())));
    auto on_step = [&](int step, int64_t tokens) {
      steps++;
      if (!is_root) return;
      progress.maybe_print([&] {
        return "{\"chunk\":" + std::to_string(k) + ",\"progress\":true,\"step\":" +
               std::to_string(step) + ",\"steps\":" + std::to_string(sp.max_new_tokens) +
               ",\"tokens\":" + std::to_string(tokens) + "}";
      });
    };
    auto g0 = std::chrono::steady_clock::now();
    if (o.no_kv_cache) model::generate(ps, ep, mine, sp, res, on_step);  // one rank only
    else model::generate(ps, *moe, mine, sp, res, on_step);
    generate_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
    res = gather_results(comm, res, counts);
    if (!is_root) continue;
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
      // text by the built-in tokenizer; a model's own tokenizer decodes on the TypeScript side
      if (pr.tokens.empty()) r.text = tasks::decode(res[i].tokens);
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
  if (!is_root) return 0;
  // generate_seconds: the decode loops alone (rank 0), split into the MoE's experts and EP
  // exchange; the rest is attention, norms, LM head and sampling
  const model::DecodeTimes& t = moe->times;
  std::printf("{\"done\":true,\"chunks\":%lld,\"new_tokens\":%lld,\"seconds\":%.4f,\"tokens_per_s\":%.1f,"
              "\"ranks\":%d,\"ep_mode\":\"%s\",\"generate_seconds\":%.4f,\"experts_seconds\":%.4f,"
              "\"ep_seconds\":%.4f,\"max_batch\":%d,\"decode_steps\":%lld,"
              "\"kv_cache_bytes\":%lld}\n",
              (long long)(num_chunks - start_chunk), (long long)total_tokens, total_s,
              total_tokens / std::max(total_s, 1e-9), R, mode.c_str(), generate_s, t.experts, t.ep,
              sp.max_batch, (long long)steps, (long long)kv_bytes);
  return 0;
}

}  // namespace
}  // namespace moerl::tools

int main(int argc, char** argv) {
  using namespace moerl::tools;
  CLI::App app{"Samples completions of a policy checkpoint into one JSONL file per chunk of prompts.",
               "moe_generate"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  Options o;
  add_options(app, o);
  return run_tool(app, argc, argv, [&] {
    keep_freed_memory();
    return run(o);
  });
}
