"""moerl's math verifier as a reward function in verl's signature (activities/rewards/math.ts).

`solution_str` is the answer already taken from the completion (the last \\boxed{...} or
`#### answer`); both it and the ground truth are parsed by math-verify as boxed LaTeX and
compared by its `verify` (numeric and symbolic equivalence). math-verify's own time limits
(signal.alarm) work here because the runner calls this in its main thread.
"""

from math_verify import parse, verify


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    gold = parse("\\boxed{" + str(ground_truth) + "}")
    answer = parse("\\boxed{" + solution_str + "}")
    return 1.0 if gold and answer and verify(gold, answer) else 0.0
