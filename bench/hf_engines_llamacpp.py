"""The llama.cpp side of bench/hf_engines.py: the benchmark's Hugging Face directory converted to
GGUF F32 with llama.cpp's own converter (scripts/llamacpp/convert.py), then decoded two ways, one
thread each:

- llama-server, as moerl's rollout engine runs it (activities/engines/llamacpp-server.ts: the
  same flags: sampler, F32 KV cache, no flash attention), with one slot per sequence (--parallel N, continuous
  batching): all N completions requested at once through /v1/completions with the prompt as
  token ids, greedy, the sampled tokens' log-probs, no early stop. New tokens over the wall time
  from the first request sent to the last answer read: decode, sampling, log-probs and HTTP, what
  a rollout pays and what moe_generate's figure counts (its prompts' prefill included).
- llama-batched-bench: llama.cpp's own decode benchmark, N sequences of a fixed prompt length in
  one batch, no sampling and no server: the engine's decode speed alone (its S_TG).
"""
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# activities/engines/llamacpp-server.ts's rolloutArgs: sample from the policy itself, F32 KV
# cache and no flash attention (moerl's precision; llama.cpp's defaults are F16 cache and flash
# attention, whose CPU kernel rounds through F16).
ROLLOUT_ARGS = ["--top-k", "0", "--min-p", "0", "--top-p", "1", "--typical", "1", "--repeat-penalty", "1",
                "--presence-penalty", "0", "--frequency-penalty", "0", "--cache-type-k", "f32", "--cache-type-v", "f32",
                "--flash-attn", "off"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaCpp:
    def __init__(self, llamacpp_dir, work, hf_dir, vocab):
        self.dir, self.work, self.hf = llamacpp_dir, work, hf_dir
        self.gguf = os.path.join(work, "model-f32.gguf")
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        # The converter needs a tokenizer: the tests' byte-level BPE (Qwen2's split pattern, which
        # llama.cpp knows as qwen2 but cannot recognise by hash: --pre-tokenizer), sized to the model.
        tok = os.path.join(work, "tokenizer")
        subprocess.run([sys.executable, os.path.join(ROOT, "test", "reference", "make_tokenizer.py"), tok,
                        "--vocab-size", str(vocab)], check=True, env=self.env, capture_output=True)
        for name in os.listdir(tok):
            shutil.copy(os.path.join(tok, name), hf_dir)
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "llamacpp", "convert.py"), llamacpp_dir, hf_dir,
                        "--outfile", self.gguf, "--outtype", "f32", "--pre-tokenizer", "qwen2"],
                       check=True, env=self.env, capture_output=True)
        self.server = None

    def start(self, sequences, context_per_slot):
        self.port = free_port()
        log = open(os.path.join(self.work, "llama-server.log"), "w")
        self.server = subprocess.Popen(
            [os.path.join(self.dir, "bin", "llama-server"), "--model", self.gguf, "--host", "127.0.0.1", "--port",
             str(self.port), "--parallel", str(sequences), "--ctx-size", str(sequences * context_per_slot),
             "--threads", "1", "--threads-batch", "1", "--cont-batching", *ROLLOUT_ARGS],
            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        # stopped however the benchmark ends (an exception too), never left running
        atexit.register(self.stop)
        deadline = time.time() + 300
        while True:
            assert self.server.poll() is None, f"llama-server exited {self.server.returncode}: see {log.name}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert time.time() < deadline, "llama-server not ready within 300 s"
            time.sleep(0.2)

    def stop(self):
        if self.server:
            self.server.terminate()
            self.server.wait(30)
            self.server = None

    def complete(self, prompt, new_tokens):
        body = json.dumps({"prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "top_p": 1, "seed": 1,
                           "logprobs": 1, "ignore_eos": True, "stream": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            choice = json.load(r)["choices"][0]
        return [e["id"] for e in choice["logprobs"]["content"]]

    def server_decode(self, prompts, new_tokens):
        """New tokens/s of all prompts decoded at once by llama-server, and the completions."""
        out = [None] * len(prompts)

        def one(i):
            out[i] = self.complete(prompts[i], new_tokens)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
        assert all(o is not None and len(o) == new_tokens for o in out), "llama-server: a completion is missing"
        return sum(len(o) for o in out) / seconds, out

    def batched_bench(self, sequences, prompt_len, new_tokens):
        """llama-batched-bench's decode tokens/s (S_TG) for `sequences` sequences at once."""
        out = subprocess.run(
            # with room to spare: a row whose tokens would not fit the context is left out silently
            [os.path.join(self.dir, "bin", "llama-batched-bench"), "--model", self.gguf, "--ctx-size",
             str(2 * sequences * (prompt_len + new_tokens)), "--batch-size", "2048", "--ubatch-size", "512",
             "-npp", str(prompt_len), "-ntg", str(new_tokens), "-npl", str(sequences), "--threads", "1",
             "--threads-batch", "1", "--cache-type-k", "f32", "--cache-type-v", "f32", "--flash-attn", "off",
             "--output-format", "jsonl"],
            env=self.env, check=True, capture_output=True, text=True)
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        assert rows, f"llama-batched-bench printed no result: {out.stderr[-2000:]}"
        return rows[-1]["speed_tg"]
