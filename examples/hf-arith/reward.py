"""The example's reward function, in verl's signature (verl/utils/reward_score): 1.0 when the
last \\boxed{...} of the completion is the row's ground truth, else 0.0. moerl calls it in a
sandboxed Python process for every sample of the data sources the spec maps to it."""
import re

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answers = BOXED.findall(solution_str)
    return 1.0 if answers and answers[-1].strip() == str(ground_truth).strip() else 0.0
