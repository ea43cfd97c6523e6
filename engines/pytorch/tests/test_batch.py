"""Inputs as moe_train reads them: list files, rollout and reward records, advantages, the split
into minibatches, ranks and micro-batches, SFT cycling; bad input names the file and line."""

import json
import math
import os
import tempfile
import unittest

from moerl_pytorch.batch import (Rollout, Sequence, group_advantages, grpo_batch, micro_batches, minibatches,
                                 read_list_file, read_rewards, read_rollouts, read_sft_examples, sequence_kl,
                                 sft_step_batch)
from moerl_pytorch.errors import BadInput


def record(prompt_id, sample_index, tokens=(5, 6), **changes):
    r = {"prompt_id": prompt_id, "sample_index": sample_index, "iteration": 0, "task": "t", "prompt": "",
         "prompt_tokens": [1, 2, 3], "tokens": list(tokens), "text": "", "logprobs": [-0.5] * len(tokens),
         "finish_reason": "length"}
    r.update(changes)
    return r


class Files(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def bad(self, fn, *pattern):
        with self.assertRaises(BadInput) as e:
            fn()
        for p in pattern:
            self.assertRegex(str(e.exception), p)


class ListFiles(Files):
    def test_blank_lines_and_crlf(self):
        a, b = self.write("a.jsonl", ""), self.write("b.jsonl", "")
        lst = self.write("list.txt", f"{a}\r\n\n  \t\n{b}\n")
        self.assertEqual(read_list_file(lst, "--rollouts-file"), [a, b])

    def test_a_path_that_does_not_open_names_list_and_line(self):
        lst = self.write("list.txt", f"{self.write('a', '')}\n\n{self.dir}/missing.jsonl\n")
        self.bad(lambda: read_list_file(lst, "--rollouts-file"), r"list\.txt line 3: cannot open .*missing\.jsonl")

    def test_missing_and_empty_lists(self):
        self.bad(lambda: read_list_file(f"{self.dir}/nope.txt", "--rewards-file"), r"--rewards-file: cannot open")
        self.bad(lambda: read_list_file(self.write("l", "\n \n"), "--rewards-file"), r"lists no files")


class Records(Files):
    def test_rollouts_read_as_the_native_reader(self):
        path = self.write("c.jsonl", json.dumps(record(3, 1, logprobs=[0.1, 0.2])) + "\n\n")
        [r] = read_rollouts(path)
        self.assertEqual((r.prompt_id, r.sample_index, r.prompt_tokens, r.tokens), (3, 1, [1, 2, 3], [5, 6]))
        self.assertEqual(r.logprobs[0], 0.10000000149011612)  # kept as a float32 value

    def test_malformed_rollouts_name_file_line_and_field(self):
        good = json.dumps(record(0, 0))
        cases = [
            ("{not json", r"c\.jsonl line 2: malformed JSON"),
            (json.dumps({k: v for k, v in record(0, 1).items() if k != "tokens"}), r'line 2: missing field "tokens"'),
            (json.dumps(record(0, 1, logprobs=[0.0])), r"line 2: 1 logprobs for 2 tokens"),
            (json.dumps({**record(0, 1), "prompt_id": "x"}), r'line 2 field "prompt_id": expected an integer'),
            (json.dumps(record(0, 1, tokens=[1, -4], logprobs=[0, 0])), r"line 2 tokens: token id -4 is negative"),
            (json.dumps(record(0, 1, prompt_tokens=[])), r"line 2 .*prompt is empty"),
            ('{"a": NaN}', r"line 2: malformed JSON"),
            ("[1]", r"line 2: expected an object"),
        ]
        for line, pattern in cases:
            path = self.write("c.jsonl", good + "\n" + line + "\n")
            self.bad(lambda: read_rollouts(path), pattern)

    def test_a_rollouts_loss_mask_is_read_and_absent_means_all_trained(self):
        path = self.write("c.jsonl", json.dumps(record(0, 0, tokens=[5, 6, 7], loss_mask=[1, 0, 1])) + "\n"
                          + json.dumps(record(0, 1, tokens=[5, 6, 7])) + "\n")
        masked, plain = read_rollouts(path)
        self.assertEqual(masked.loss_mask, [1, 0, 1])
        self.assertIsNone(plain.loss_mask)

    def test_bad_loss_masks_name_file_line_and_entry(self):
        good = json.dumps(record(0, 0))
        cases = [
            (record(0, 1, loss_mask=[1, 2]),
             r"c\.jsonl line 2 loss_mask: entry 1 is 2; each entry is 0 \(an environment's token\) or 1 "
             r"\(the policy's\)$"),
            (record(0, 1, loss_mask=[-1, 1]), r"line 2 loss_mask: entry 0 is -1; each entry is 0"),
            (record(0, 1, loss_mask=[1]), r"c\.jsonl line 2 loss_mask: 1 entries for 2 completion tokens$"),
            (record(0, 1, loss_mask=[1, 1, 0]), r"line 2 loss_mask: 3 entries for 2 completion tokens$"),
            (record(0, 1, loss_mask=[1, 0.5]), r"line 2 loss_mask: expected an integer, got 0\.5"),
            (record(0, 1, loss_mask=[1, True]), r"line 2 loss_mask: expected an integer, got true"),
            (record(0, 1, loss_mask=1), r'line 2 field "loss_mask": expected an array, got 1'),
        ]
        for r, pattern in cases:
            path = self.write("c.jsonl", good + "\n" + json.dumps(r) + "\n")
            self.bad(lambda: read_rollouts(path), pattern)

    def test_sft_examples_take_a_loss_mask(self):
        path = self.write("s.jsonl", '{"prompt_tokens":[4,5],"tokens":[6,7,1],"loss_mask":[1,0,1]}\n'
                                     '{"prompt_tokens":[7],"tokens":[1]}\n')
        masked, plain = read_sft_examples(path)
        self.assertEqual((masked.loss_mask, masked.trained_tokens), ([1, 0, 1], 2))
        self.assertEqual((plain.loss_mask, plain.trained_tokens), (None, 1))
        self.bad(lambda: read_sft_examples(self.write("e.jsonl", '{"prompt_tokens":[4],"tokens":[6,1],'
                                                                 '"loss_mask":[0,3]}\n')),
                 r"e\.jsonl line 1 loss_mask: entry 1 is 3; each entry is 0")
        self.bad(lambda: read_sft_examples(self.write("e.jsonl", '{"prompt_tokens":[4],"tokens":[6],'
                                                                 '"loss_mask":[1,1]}\n')),
                 r"e\.jsonl line 1 loss_mask: 2 entries for 1 completion tokens")

    def test_rewards_later_line_wins_and_bad_reward_is_named(self):
        path = self.write("r.jsonl", '{"prompt_id":1,"sample_index":0,"reward":1}\n'
                                     '{"prompt_id":1,"sample_index":0,"reward":0.5}\n')
        self.assertEqual(read_rewards([path]), {(1, 0): 0.5})
        bad = self.write("r2.jsonl", '{"prompt_id":1,"sample_index":0,"reward":"1"}\n')
        self.bad(lambda: read_rewards([bad]), r'r2\.jsonl line 1 field "reward": expected a number')

    def test_sft_examples(self):
        path = self.write("s.jsonl", '{"prompt_tokens":[4,5],"tokens":[6,1]}\n{"prompt_tokens":[7],"tokens":[1]}\n')
        ex = read_sft_examples(path)
        self.assertEqual([(e.tokens, e.prompt_len) for e in ex], [([4, 5, 6, 1], 2), ([7, 1], 1)])
        # batch s takes lines (first + s * batch_size + i) mod lines
        self.assertEqual([e.tokens for e in sft_step_batch(ex, 1, 3, 1)], [[4, 5, 6, 1], [7, 1], [4, 5, 6, 1]])
        self.bad(lambda: read_sft_examples(self.write("e.jsonl", '{"prompt_tokens":[4],"tokens":[]}\n')),
                 r"line 1 .*completion is empty")


class Advantages(unittest.TestCase):
    def test_group_normalised_sorted_and_skipped(self):
        rollouts = [Rollout(2, 1, [9], [4], [-1.0]), Rollout(1, 0, [9], [4], [-1.0]),
                    Rollout(2, 0, [9], [5, 6], [-1.0, -2.0]), Rollout(1, 1, [9], [4], [-1.0]),
                    Rollout(2, 2, [9], [], [])]
        rewards = {(1, 0): 0.5, (1, 1): 0.5, (2, 0): 1.0, (2, 1): 0.0, (2, 2): 0.5}
        b = grpo_batch(rollouts, rewards)
        self.assertEqual((b.groups, b.skipped_groups, b.samples), (2, 1, 5))
        self.assertAlmostEqual(b.mean_reward, 0.5)
        # group 2: mean 0.5, population std sqrt(1/6); the empty sample (2, 2) is left out
        sd = (1 / 6) ** 0.5
        self.assertEqual([s.tokens for s in b.sequences], [[9, 5, 6], [9, 4]])
        self.assertAlmostEqual(b.sequences[0].advantage, 0.5 / (sd + 1e-6), places=6)
        self.assertAlmostEqual(b.sequences[1].advantage, -0.5 / (sd + 1e-6), places=6)
        self.assertEqual(b.sequences[0].old_logprobs, [-1.0, -2.0])

    def test_the_rollouts_loss_mask_reaches_its_sequence(self):
        rollouts = [Rollout(1, 0, [9], [4, 5], [-1.0, -1.0], [0, 1]), Rollout(1, 1, [9], [4], [-1.0])]
        b = grpo_batch(rollouts, {(1, 0): 1.0, (1, 1): 0.0})
        self.assertEqual([s.loss_mask for s in b.sequences], [[0, 1], None])
        self.assertEqual([s.trained_tokens for s in b.sequences], [1, 1])

    def test_mask_truncated_trains_no_cut_sample_but_keeps_it_in_its_group(self):
        rollouts = [Rollout(1, 0, [9], [4, 5], [-1.0] * 2, None, "length"), Rollout(1, 1, [9], [4], [-1.0]),
                    Rollout(1, 2, [9], [6], [-1.0]), Rollout(2, 0, [9], [8], [-1.0], None, "length"),
                    Rollout(2, 1, [9], [7], [-1.0], None, "length")]
        rewards = {(1, 0): 0.0, (1, 1): 1.0, (1, 2): 0.5, (2, 0): 1.0, (2, 1): 0.0}
        plain = grpo_batch(rollouts, rewards, "group-mean")
        masked = grpo_batch(rollouts, rewards, "group-mean", mask_truncated=True)
        self.assertEqual((plain.overlong_filtered, masked.overlong_filtered), (0, 3))
        self.assertEqual(len(plain.sequences), 5)
        # group 1's mean still counts the cut sample's 0: the others keep their advantages
        self.assertEqual([(s.tokens, round(s.advantage, 6)) for s in masked.sequences], [([9, 4], 0.5), ([9, 6], 0.0)])
        self.assertEqual(masked.sequences, [s for s in plain.sequences if s.tokens in ([9, 4], [9, 6])])
        self.assertEqual(rollouts[0].loss_mask, None)  # the caller's records are left as they were

    def test_kl_penalties_move_rewards_before_advantages(self):
        rollouts = [Rollout(1, 0, [9], [4], [-1.0]), Rollout(1, 1, [9], [5], [-1.0])]
        rewards = {(1, 0): 1.0, (1, 1): 1.0}
        self.assertEqual(grpo_batch(rollouts, rewards).skipped_groups, 1)
        b = grpo_batch(rollouts, rewards, "group-mean", penalties={(1, 0): 0.5})
        # 1 - 0.5 and 1: mean 0.75; the mean reward stays the rewards' own
        self.assertEqual([s.advantage for s in b.sequences], [-0.25, 0.25])
        self.assertEqual((b.skipped_groups, b.mean_reward), (0, 1.0))

    def test_sequence_kl_sums_the_estimator_over_trained_tokens(self):
        s = Sequence(tokens=[5, 6, 7, 8], prompt_len=1, old_logprobs=[-1.0, -2.0, -0.5],
                     ref_logprobs=[-1.5, -1.0, -3.0], loss_mask=[1, 0, 1])
        d0, d2 = -0.5, -2.5
        self.assertAlmostEqual(sequence_kl(s, "k1"), -d0 - d2)
        self.assertAlmostEqual(sequence_kl(s, "k2"), (d0 * d0 + d2 * d2) / 2)
        self.assertAlmostEqual(sequence_kl(s, "k3"), math.exp(d0) - d0 - 1 + math.exp(d2) - d2 - 1)

    def test_each_estimator_from_its_formula(self):
        groups = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.5], [2.0, 0.0, 1.0]]
        tokens = [[3, 5, 2, 2], [1, 1], [4, 4, 0]]
        self.assertIsNone(group_advantages(groups, tokens, "rloo")[1])
        self.assertEqual(group_advantages(groups, tokens, "group-mean")[0], [0.5, -0.5, -0.5, 0.5])
        rloo = group_advantages(groups, tokens, "rloo")
        self.assertAlmostEqual(rloo[0][0], 1 - 1 / 3, places=6)
        self.assertAlmostEqual(rloo[2][0], 2 - 0.5, places=6)
        # REINFORCE++ baseline: r - mean, whitened over the kept samples weighted by their tokens
        a = [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0]
        w = [3, 5, 2, 2, 4, 4, 0]
        mu = sum(x * n for x, n in zip(a, w)) / sum(w)
        var = sum(n * (x - mu) ** 2 for x, n in zip(a, w)) / sum(w)
        pp = group_advantages(groups, tokens, "reinforce-pp-baseline")
        self.assertAlmostEqual(pp[0][1], (-0.5 - mu) / (var + 1e-8) ** 0.5, places=5)
        self.assertAlmostEqual(pp[2][0], (1.0 - mu) / (var + 1e-8) ** 0.5, places=5)
        # the trained tokens of a rollout are its loss mask's 1s
        rollouts = [Rollout(1, 0, [9], [4, 5, 6], [-1.0] * 3, [1, 0, 1]), Rollout(1, 1, [9], [4], [-1.0]),
                    Rollout(2, 0, [9], [4], [-1.0]), Rollout(2, 1, [9], [4], [-1.0])]
        b = grpo_batch(rollouts, {(1, 0): 1.0, (1, 1): 0.0, (2, 0): 0.0, (2, 1): 1.0}, "reinforce-pp-baseline")
        mu = (2 * 0.5 - 0.5 - 0.5 + 0.5) / 5
        var = (2 * (0.5 - mu) ** 2 + (-0.5 - mu) ** 2 + (-0.5 - mu) ** 2 + (0.5 - mu) ** 2) / 5
        self.assertAlmostEqual(b.sequences[0].advantage, (0.5 - mu) / (var + 1e-8) ** 0.5, places=5)

    def test_a_missing_reward_is_named(self):
        with self.assertRaisesRegex(BadInput, "no reward for prompt 7 sample 3"):
            grpo_batch([Rollout(7, 3, [1], [2], [0.0])], {})


class Splits(unittest.TestCase):
    def test_minibatches_take_every_kth_sequence(self):
        self.assertEqual(minibatches(list(range(7)), 3), [[0, 3, 6], [1, 4], [2, 5]])

    def test_ranks_get_the_same_number_of_micro_batches(self):
        # 13 sequences, 2 ranks, micro-batch 2: rank 0 has 7 (4 micro-batches), rank 1 has 6 and
        # an empty fourth
        self.assertEqual(micro_batches(13, 0, 2, 2), [[0, 2], [4, 6], [8, 10], [12]])
        self.assertEqual(micro_batches(13, 1, 2, 2), [[1, 3], [5, 7], [9, 11], []])
        # R ranks with micro-batch m group the sequences as one rank with m * R does
        for k, ids in enumerate(micro_batches(13, 0, 1, 4)):
            self.assertEqual(sorted(ids), sorted(micro_batches(13, 0, 2, 2)[k] + micro_batches(13, 1, 2, 2)[k]))


if __name__ == "__main__":
    unittest.main()
