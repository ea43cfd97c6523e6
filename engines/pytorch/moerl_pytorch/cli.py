"""`python -m moerl_pytorch grpo|sft ...`: the PyTorch trainer rank, with `moe_train grpo|sft`'s
flags where they mean the same and Hugging Face directories in and out (docs/engines.md).

Exit 0 done (or --help), 2 bad input (a flag, a variable of the rank contract, a file: do not
retry), 1 anything else (retryable). stdout of rank 0, one JSON object per line: the metrics of
each optimizer step (also appended to --metrics) and, during long phases, at most once per
--progress-interval seconds, {"progress":true,"phase":...} as moe_train prints them.

Every input is read and checked before torch is imported and before the ranks meet, so bad
input fails each rank alike, fast, and never leaves a peer waiting."""

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

from . import ENGINE_CONTRACT_VERSION
from .algorithms import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from .batch import (check_tokens, grpo_batch, kl_samples, read_list_file, read_rewards, read_rollouts,
                    read_sft_examples)
from .errors import BadInput
from .hfdir import HfDir
from .contract import read_contract

PROG = "moerl-pytorch"


def f32(text: str) -> float:
    """A float flag, rounded to float32 as the native flags are parsed."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text}")
    return float(np.float32(x))


def checked(kind, rule: str, ok):
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text}")
        if not ok(x):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return x
    return parse


positive_int = checked(int, "> 0", lambda x: x > 0)
nonneg_int = checked(int, ">= 0", lambda x: x >= 0)
positive_f32 = checked(f32, "> 0", lambda x: x > 0)
nonneg_f32 = checked(f32, ">= 0", lambda x: x >= 0)


def add_common(p: argparse.ArgumentParser, lr: float) -> None:
    p.add_argument("--checkpoint", required=True, help="Hugging Face model directory to start from")
    p.add_argument("--out", required=True, help="Hugging Face model directory to write (rank 0)")
    p.add_argument("--metrics", default="", help="JSONL file to append step metrics to")
    p.add_argument("--progress-interval", type=nonneg_f32, default=1.0, help="seconds between progress lines")
    p.add_argument("--lr", type=nonneg_f32, default=lr, help="peak learning rate")
    p.add_argument("--weight-decay", type=f32, default=0.0, help="decoupled weight decay (matrices)")
    p.add_argument("--grad-clip", type=f32, default=1.0, help="global gradient norm limit, <= 0 disables")
    p.add_argument("--warmup-steps", type=nonneg_int, default=0, help="linear warmup steps")
    p.add_argument("--min-lr-ratio", type=f32, default=0.1, help="cosine decay floor, fraction of --lr")
    p.add_argument("--beta2", type=f32, default=0.95, help="AdamW second-moment decay")
    p.add_argument("--aux-coef", type=f32, default=0.01, help="load-balance loss weight")
    p.add_argument("--z-coef", type=f32, default=0.001, help="router z-loss weight")
    p.add_argument("--micro-batch", type=positive_int, default=64, help="sequences per forward/backward on a rank")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: a GPU (NCCL) when one is visible, else the CPU (gloo)")
    p.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"],
                   help="transformers' attention implementation")
    p.add_argument("--max-shard-bytes", type=positive_int, default=5_000_000_000,
                   help="largest safetensors shard written")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    top.add_argument("--version", action="version", version=f"engine contract v{ENGINE_CONTRACT_VERSION}")
    sub = top.add_subparsers(dest="command", required=True)
    defaults = argparse.ArgumentDefaultsHelpFormatter
    g = sub.add_parser("grpo", help="GRPO steps on scored rollouts", formatter_class=defaults)
    add_common(g, 1e-3)
    g.add_argument("--rollouts-file", required=True, help="text file listing the rollout JSONL files")
    g.add_argument("--rewards-file", required=True, help="text file listing the rewards JSONL files")
    g.add_argument("--iteration", type=nonneg_int, default=0, help="campaign iteration (copied into metrics)")
    g.add_argument("--ref-checkpoint", default="", help="reference policy of the KL term (HF directory)")
    g.add_argument("--kl-coef", type=f32, default=0.0, help="KL weight (needs --ref-checkpoint)")
    g.add_argument("--kl-in-reward", action="store_true",
                   help="the KL is a penalty on each sample's reward before its advantage, not a loss term: "
                        "reward - kl-coef * Σ_t kl(rollout log-prob, reference log-prob)")
    g.add_argument("--kl-estimator", choices=KL_ESTIMATORS, default="k3", help="estimator of the KL term")
    g.add_argument("--entropy-coef", type=f32, default=0.0, help="entropy bonus weight")
    g.add_argument("--policy-loss", choices=POLICY_LOSSES, default="ppo-clip", help="policy term of each token")
    g.add_argument("--aggregation", choices=AGGREGATIONS, default="token-mean",
                   help="how token losses make the step's loss")
    g.add_argument("--advantage", choices=ADVANTAGE_ESTIMATORS, default="group-norm",
                   help="advantage estimator of the rewards")
    g.add_argument("--clip-eps", type=nonneg_f32, default=0.2,
                   help="ratio clip below, 1 - eps (and above without --clip-high)")
    g.add_argument("--clip-high", type=nonneg_f32, default=None, help="ratio clip above, 1 + eps [default: --clip-eps]")
    g.add_argument("--norm-tokens", type=nonneg_f32, default=0.0,
                   help="seq-mean-token-sum-norm's constant token count")
    g.add_argument("--mask-truncated", action="store_true",
                   help="DAPO's overlong filtering: no loss on samples cut at the length limit (finish_reason "
                        "length); they still count in their group's advantages")
    g.add_argument("--tis-clip", type=nonneg_f32, default=0.0,
                   help="truncated importance sampling cap on p_train / p_rollout, 0 = off")
    g.add_argument("--temperature", type=positive_f32, default=1.0, help="sampling temperature of the rollouts")
    g.add_argument("--minibatches", type=positive_int, default=1, help="optimizer steps per epoch")
    g.add_argument("--epochs", type=positive_int, default=1, help="passes over the rollouts")
    g.add_argument("--decay-steps", type=nonneg_int, default=0, help="cosine decay steps, 0 = constant")
    s = sub.add_parser("sft", help="supervised fine-tuning on token ids", formatter_class=defaults)
    add_common(s, 3e-3)
    s.add_argument("--data", required=True,
                   help='JSONL of {"prompt_tokens":[ids],"tokens":[ids]} (the completion learned), with an '
                        'optional "loss_mask": 0/1 per token, 0 = not learned')
    s.add_argument("--steps", type=positive_int, default=200, help="optimizer steps")
    s.add_argument("--batch-size", type=positive_int, default=64, help="sequences per step")
    s.add_argument("--first-prompt", type=nonneg_int, default=0, help="first --data line")
    s.add_argument("--decay-steps", type=nonneg_int, default=None, help="cosine decay steps [default: --steps]")
    return top


class Output:
    """Rank 0's stdout lines and metrics file; progress lines at most once per interval."""

    def __init__(self, is_root: bool, metrics: str, interval_s: float):
        self.is_root, self.metrics, self.interval_s = is_root, metrics, interval_s
        self.last = time.monotonic()

    def line(self, obj: dict, to_metrics: bool) -> None:
        if not self.is_root:
            return
        text = json.dumps(obj, separators=(",", ":"))
        print(text, flush=True)
        if to_metrics and self.metrics:
            parent = os.path.dirname(self.metrics)
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(text + "\n")

    def progress(self, phase: str, **fields) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            self.last = now
            self.line({"progress": True, "phase": phase, **fields}, False)

    def step_progress(self, phase: str, step: int, steps: int):
        return lambda done, total: self.progress(phase, step=step, steps=steps, micro_batch=done,
                                                 micro_batches=total)


def grpo(a) -> int:
    contract = read_contract()
    out = Output(contract.rank == 0, a.metrics, a.progress_interval)
    if a.kl_coef != 0.0 and not a.ref_checkpoint:
        raise BadInput("--kl-coef > 0 needs --ref-checkpoint")
    if a.kl_in_reward and a.kl_coef <= 0.0:
        raise BadInput("--kl-in-reward needs --kl-coef > 0")
    if a.aggregation == "seq-mean-token-sum-norm" and a.norm_tokens <= 0:
        raise BadInput("--aggregation seq-mean-token-sum-norm needs --norm-tokens > 0")
    if a.clip_high is None:
        a.clip_high = a.clip_eps
    rollout_files = read_list_file(a.rollouts_file, "--rollouts-file")
    rewards = read_rewards(read_list_file(a.rewards_file, "--rewards-file"))
    rollouts = []
    for i, path in enumerate(rollout_files):
        rollouts += read_rollouts(path)
        out.progress("read_rollouts", files=i + 1, of=len(rollout_files))
    batch = grpo_batch(rollouts, rewards, a.advantage, a.mask_truncated)
    policy = HfDir(a.checkpoint, "--checkpoint")
    ref = HfDir(a.ref_checkpoint, "--ref-checkpoint") if a.kl_coef != 0.0 else None
    # the KL as a reward penalty: every sample is scored under the reference, then batched again
    scored = kl_samples(rollouts, a.mask_truncated) if a.kl_in_reward else []
    check_tokens(batch.sequences + [s for _, s in scored], policy.vocab_size, policy.max_len, a.rollouts_file)
    from .runner import run_grpo  # torch and transformers: only once the inputs are good

    def rebatch(penalties):
        return grpo_batch(rollouts, rewards, a.advantage, a.mask_truncated, penalties)

    return run_grpo(a, contract, out, batch, policy, ref, scored, rebatch)


def sft(a) -> int:
    contract = read_contract()
    out = Output(contract.rank == 0, a.metrics, a.progress_interval)
    examples = read_sft_examples(a.data)
    policy = HfDir(a.checkpoint, "--checkpoint")
    check_tokens(examples, policy.vocab_size, policy.max_len, a.data)
    from .runner import run_sft

    return run_sft(a, contract, out, examples, policy)


def main(argv=None) -> int:
    a = parser().parse_args(argv)  # a bad flag exits 2 naming it, --help 0
    try:
        return grpo(a) if a.command == "grpo" else sft(a)
    except BadInput as e:
        print(f"{PROG} {a.command}: error: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # retryable: a peer died, a timeout, the machine
        traceback.print_exc()
        print(f"{PROG} {a.command}: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())
