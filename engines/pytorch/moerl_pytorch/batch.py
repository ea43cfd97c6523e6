"""The trainer's inputs, read as `moe_train` reads them (native/tools/moe_train.cc, moe_cli.cc):
list files, rollout records, rewards, SFT examples; group-normalised advantages; the split of
a step's sequences into minibatches, ranks and micro-batches. Plain Python, no torch: every
rank reads the same files and builds the same batch before any rank talks to another, so bad
input fails every rank alike (exit 2) instead of leaving peers waiting."""

import json
import math
from dataclasses import dataclass, field, replace

import numpy as np

from .errors import BadInput


@dataclass
class Sequence:
    """One training sequence: the prompt followed by the completion (TrainSequence)."""

    tokens: list[int]
    prompt_len: int  # the loss is on positions predicting tokens[prompt_len:]
    old_logprobs: list[float] = field(default_factory=list)  # [completion] behaviour, GRPO
    advantage: float = 0.0  # GRPO, per sequence (a float32 value)
    ref_logprobs: list[float] | None = None  # [completion] reference policy, GRPO with KL
    # [completion] this trainer's log-probs at the sequence's first forward of the update (GRPO):
    # the old policy of truncated importance sampling and of mismatch_kl; filled by that forward
    train_logprobs: list[float] | None = None
    # [completion] 1 where the token is the policy's own and trained, 0 where an environment wrote
    # it (a tool result, an observation of a multi-turn episode: no loss); None = all trained.
    # Masked positions hold 0 in train_logprobs and ref_logprobs.
    loss_mask: list[int] | None = None

    @property
    def completion_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    def trained(self, j: int) -> bool:
        """Whether completion token j (the target of position prompt_len - 1 + j) is trained."""
        return self.loss_mask is None or self.loss_mask[j] != 0

    @property
    def trained_tokens(self) -> int:
        """The completion less its masked positions: what the token losses are means over."""
        if self.loss_mask is None:
            return self.completion_len
        return sum(1 for m in self.loss_mask if m != 0)


def read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{what}: cannot open {path}: {e.strerror if isinstance(e, OSError) else e}")


def read_list_file(path: str, flag: str) -> list[str]:
    """A text file with one path per line; blank lines are ignored and a trailing CR dropped.
    Every path must open; a list without paths is bad input."""
    paths = []
    for n, line in enumerate(read_text(path, flag).split("\n"), 1):
        p = line[:-1] if line.endswith("\r") else line
        if p.strip(" \t") == "":
            continue
        try:
            with open(p, "rb"):
                pass
        except OSError as e:
            raise BadInput(f"{path} line {n}: cannot open {p}: {e.strerror}")
        paths.append(p)
    if not paths:
        raise BadInput(f"{flag} {path} lists no files")
    return paths


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def json_lines(path: str):
    """(what, object) per non-empty line, what = '<path> line <n>'."""
    text = read_text(path, "input")
    for n, line in enumerate(text.split("\n"), 1):
        if line == "":
            continue
        what = f"{path} line {n}"
        try:
            yield what, json.loads(line, parse_constant=_no_constant)
        except ValueError as e:
            raise BadInput(f"{what}: malformed JSON: {e}")


def _field(obj, key: str, what: str):
    if not isinstance(obj, dict):
        raise BadInput(f"{what}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise BadInput(f'{what}: missing field "{key}"')
    return obj[key]


def _integer(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadInput(f"{what}: expected an integer, got {json.dumps(v)}")
    if isinstance(v, float):
        if not math.isfinite(v) or v != math.trunc(v):
            raise BadInput(f"{what}: expected an integer, got {json.dumps(v)}")
        v = int(v)
    return v


def _number(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadInput(f"{what}: expected a number, got {json.dumps(v)}")
    return float(v)


def integer_field(obj, key: str, what: str) -> int:
    return _integer(_field(obj, key, what), f'{what} field "{key}"')


def number_field(obj, key: str, what: str) -> float:
    return _number(_field(obj, key, what), f'{what} field "{key}"')


def string_field(obj, key: str, what: str) -> str:
    v = _field(obj, key, what)
    if not isinstance(v, str):
        raise BadInput(f'{what} field "{key}": expected a string, got {json.dumps(v)}')
    return v


def token_field(obj, key: str, what: str) -> list[int]:
    v = _field(obj, key, what)
    if not isinstance(v, list):
        raise BadInput(f'{what} field "{key}": expected an array, got {json.dumps(v)}')
    ids = [_integer(t, f"{what} {key}") for t in v]
    for t in ids:
        if t < 0:
            raise BadInput(f"{what} {key}: token id {t} is negative")
    return ids


def numbers_field(obj, key: str, what: str) -> list[float]:
    v = _field(obj, key, what)
    if not isinstance(v, list):
        raise BadInput(f'{what} field "{key}": expected an array, got {json.dumps(v)}')
    return [_number(x, f"{what} {key}") for x in v]


def loss_mask_field(obj, completion: int, what: str) -> list[int] | None:
    """The optional "loss_mask" of a rollout or SFT line (moe_cli.cc loss_mask_field): 0 or 1
    per completion token, `completion` of them; None when the line has none (all trained)."""
    if "loss_mask" not in obj:
        return None
    v = obj["loss_mask"]
    if not isinstance(v, list):
        raise BadInput(f'{what} field "loss_mask": expected an array, got {json.dumps(v)}')
    mask = []
    for m in v:
        m = _integer(m, f"{what} loss_mask")
        if m not in (0, 1):
            raise BadInput(f"{what} loss_mask: entry {len(mask)} is {m}; each entry is 0 (an environment's "
                           f"token) or 1 (the policy's)")
        mask.append(m)
    if len(mask) != completion:
        raise BadInput(f"{what} loss_mask: {len(mask)} entries for {completion} completion tokens")
    return mask


@dataclass
class Rollout:
    prompt_id: int
    sample_index: int
    prompt_tokens: list[int]
    tokens: list[int]
    logprobs: list[float]  # float32 values, as the native reader keeps them
    # [tokens] 1 = the policy's token (trained), 0 = an environment's (an episode's tool result);
    # None (no "loss_mask" key) = all the policy's: a one-shot completion
    loss_mask: list[int] | None = None
    finish_reason: str = "stop"  # "length": cut at the length limit


def read_rollouts(path: str) -> list[Rollout]:
    """The records moe_generate writes (docs/native-model.md, "Rollout JSONL"), with the fields
    the native reader requires, and the optional "loss_mask" of a multi-turn episode."""
    out = []
    for what, j in json_lines(path):
        r = Rollout(
            prompt_id=integer_field(j, "prompt_id", what),
            sample_index=integer_field(j, "sample_index", what),
            prompt_tokens=token_field(j, "prompt_tokens", what),
            tokens=token_field(j, "tokens", what),
            logprobs=[float(np.float32(x)) for x in numbers_field(j, "logprobs", what)],
        )
        for key in ("prompt", "text"):
            string_field(j, key, what)
        r.finish_reason = string_field(j, "finish_reason", what)
        if len(r.logprobs) != len(r.tokens):
            raise BadInput(f"{what}: {len(r.logprobs)} logprobs for {len(r.tokens)} tokens")
        r.loss_mask = loss_mask_field(j, len(r.tokens), what)
        if not r.prompt_tokens:
            raise BadInput(f'{what} field "prompt_tokens": the prompt is empty')
        out.append(r)
    return out


def read_rewards(paths: list[str]) -> dict[tuple[int, int], float]:
    """(prompt id, sample index) -> reward as a float32 value; a later line wins."""
    rewards = {}
    for path in paths:
        for what, j in json_lines(path):
            key = (integer_field(j, "prompt_id", what), integer_field(j, "sample_index", what))
            rewards[key] = float(np.float32(number_field(j, "reward", what)))
    return rewards


@dataclass
class GrpoBatch:
    sequences: list[Sequence]
    mean_reward: float
    groups: int
    skipped_groups: int
    samples: int
    overlong_filtered: int = 0


def group_advantages(groups: list[list[float]], trained_tokens: list[list[int]], estimator: str):
    """native/rl/advantages.cc: per prompt group of rewards, its samples' advantages, or None for
    a group whose population std is below 1e-6 (no signal). group-norm (r - mean) / (std + 1e-6),
    group-mean r - mean, rloo n / (n - 1) (r - mean), reinforce-pp-baseline r - mean whitened over
    the kept samples weighted by their trained tokens, (a - mu) / sqrt(var + 1e-8). The mean is
    accumulated in float64 in sample order, each x / n in float32 as the native code divides;
    each advantage is kept as float32."""
    out = []
    for r in groups:
        mean = 0.0
        for x in r:  # x / n in float32, as the native `float / size_t`
            mean += float(np.float32(x) / np.float32(len(r)))
        var = 0.0
        for x in r:
            var += (x - mean) * (x - mean) / len(r)
        sd = math.sqrt(var)
        if sd < 1e-6:
            out.append(None)
        elif estimator == "group-norm":
            out.append([float(np.float32((x - mean) / (sd + 1e-6))) for x in r])
        elif estimator == "rloo":
            out.append([float(np.float32((x - mean) * len(r) / (len(r) - 1.0))) for x in r])
        else:
            out.append([float(np.float32(x - mean)) for x in r])
    if estimator != "reinforce-pp-baseline":
        return out
    kept = [(a, n) for adv, ns in zip(out, trained_tokens) if adv is not None for a, n in zip(adv, ns)]
    w_sum = float(sum(n for _, n in kept))
    if w_sum <= 0:
        return out
    mu = sum(n * a for a, n in kept) / w_sum
    var = sum(n * (a - mu) * (a - mu) / w_sum for a, n in kept)
    return [None if adv is None else [float(np.float32((a - mu) / math.sqrt(var + 1e-8))) for a in adv]
            for adv in out]


def sorted_rollouts(rollouts: list[Rollout], mask_truncated: bool = False) -> list[Rollout]:
    """Sorted by (prompt id, sample index). mask_truncated (DAPO's overlong filtering): a sample
    cut at the length limit is masked whole (new records; the caller's stay as they are)."""
    rollouts = sorted(rollouts, key=lambda r: (r.prompt_id, r.sample_index))
    if not mask_truncated:
        return rollouts
    return [replace(ro, loss_mask=[0] * len(ro.tokens)) if ro.finish_reason == "length" else ro for ro in rollouts]


def kl_samples(rollouts: list[Rollout], mask_truncated: bool = False) -> list[tuple[tuple[int, int], Sequence]]:
    """The KL as a reward penalty: every sample with tokens, sorted_rollouts' order, as a sequence
    for the reference policy to score, with its (prompt id, sample index)."""
    return [((ro.prompt_id, ro.sample_index),
             Sequence(tokens=ro.prompt_tokens + ro.tokens, prompt_len=len(ro.prompt_tokens),
                      old_logprobs=ro.logprobs, loss_mask=ro.loss_mask))
            for ro in sorted_rollouts(rollouts, mask_truncated) if ro.tokens]


def sequence_kl(s: Sequence, estimator: str) -> float:
    """native rl::sequence_kl: Σ over the trained tokens of the estimator's KL at
    d = ref_logprobs - old_logprobs (docs/algorithms.md), in float64."""
    total = 0.0
    for j in range(s.completion_len):
        if s.trained(j):
            d = s.ref_logprobs[j] - s.old_logprobs[j]
            total += -d if estimator == "k1" else d * d / 2 if estimator == "k2" else math.exp(d) - d - 1
    return total


def grpo_batch(rollouts: list[Rollout], rewards: dict[tuple[int, int], float],
               estimator: str = "group-norm", mask_truncated: bool = False,
               penalties: dict[tuple[int, int], float] | None = None) -> GrpoBatch:
    """Samples sorted_rollouts, grouped by prompt, advantages by group_advantages; a group with
    no signal is skipped, a sample with no trained token left out. A sample cut short under
    mask_truncated counts in its group's advantages but is not trained on. penalties (the KL as
    a reward penalty): subtracted from the samples' rewards before their advantages, the result
    a float32 value; mean_reward stays the rewards' own."""
    filtered = sum(1 for ro in rollouts if ro.finish_reason == "length") if mask_truncated else 0
    rollouts = sorted_rollouts(rollouts, mask_truncated)
    spans, groups, tokens, reward_sum = [], [], [], 0.0
    i = 0
    while i < len(rollouts):
        j = i
        while j < len(rollouts) and rollouts[j].prompt_id == rollouts[i].prompt_id:
            j += 1
        r = []
        for ro in rollouts[i:j]:
            key = (ro.prompt_id, ro.sample_index)
            if key not in rewards:
                raise BadInput(f"no reward for prompt {ro.prompt_id} sample {ro.sample_index}")
            r.append(rewards[key] if penalties is None
                     else float(np.float32(rewards[key] - penalties.get(key, 0.0))))
            reward_sum += rewards[key]
        spans.append((i, j))
        groups.append(r)
        tokens.append([len(ro.tokens) if ro.loss_mask is None else sum(1 for m in ro.loss_mask if m == 1)
                       for ro in rollouts[i:j]])
        i = j
    seqs, skipped = [], 0
    for (i, j), adv in zip(spans, group_advantages(groups, tokens, estimator)):
        if adv is None:
            skipped += 1
            continue
        for k, ro in enumerate(rollouts[i:j]):
            if not ro.tokens or (ro.loss_mask is not None and 1 not in ro.loss_mask):
                continue
            seqs.append(Sequence(tokens=ro.prompt_tokens + ro.tokens, prompt_len=len(ro.prompt_tokens),
                                 old_logprobs=ro.logprobs, advantage=adv[k], loss_mask=ro.loss_mask))
    mean_reward = reward_sum / len(rollouts) if rollouts else 0.0
    return GrpoBatch(seqs, mean_reward, len(groups), skipped, len(rollouts), filtered)


def read_sft_examples(path: str) -> list[Sequence]:
    """JSONL lines {"prompt_tokens":[ids],"tokens":[ids]}: the completion is learned as given
    (end it with the model's eos id if the model should learn to stop), but for the 0s of an
    optional "loss_mask" (0/1 per completion token: an episode's environment tokens)."""
    out = []
    for what, j in json_lines(path):
        prompt = token_field(j, "prompt_tokens", what)
        completion = token_field(j, "tokens", what)
        if not prompt:
            raise BadInput(f'{what} field "prompt_tokens": the prompt is empty')
        if not completion:
            raise BadInput(f'{what} field "tokens": the completion is empty')
        out.append(Sequence(tokens=prompt + completion, prompt_len=len(prompt),
                            loss_mask=loss_mask_field(j, len(completion), what)))
    if not out:
        raise BadInput(f"{path} holds no examples")
    return out


def sft_step_batch(examples: list[Sequence], step: int, batch_size: int, first: int) -> list[Sequence]:
    """Batch `step` takes lines (first + step * batch_size + i) mod lines, as moe_train sft
    --data cycles its file."""
    n = len(examples)
    return [examples[(first + step * batch_size + i) % n] for i in range(batch_size)]


def check_tokens(seqs: list[Sequence], vocab_size: int, max_len: int, what: str) -> None:
    for i, s in enumerate(seqs):
        if len(s.tokens) > max_len:
            raise BadInput(f"{what}: sequence {i} has {len(s.tokens)} tokens, more than the model's "
                           f"max_position_embeddings {max_len}")
        for t in s.tokens:
            if t >= vocab_size:
                raise BadInput(f"{what}: sequence {i}: token id {t} outside the vocabulary of {vocab_size}")


def minibatches(seqs: list[Sequence], count: int) -> list[list[Sequence]]:
    """Minibatch m holds sequences i with i % count == m."""
    out = [[] for _ in range(count)]
    for i, s in enumerate(seqs):
        out[i % count].append(s)
    return out


def micro_batches(n: int, rank: int, world_size: int, micro_batch: int) -> list[list[int]]:
    """This rank's share of a step's n sequences (i % world_size == rank) in micro-batches of at
    most micro_batch; every rank gets the same number of micro-batches (some possibly empty),
    since each one's balance loss is a collective."""
    mine = list(range(rank, n, world_size))
    max_share = (n + world_size - 1) // world_size
    count = max(1, (max_share + micro_batch - 1) // micro_batch)
    out = [[] for _ in range(count)]
    for j, i in enumerate(mine):
        out[j // micro_batch].append(i)
    return out
