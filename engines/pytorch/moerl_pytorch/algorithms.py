"""The names of the algorithm choices both trainers take as flags (docs/algorithms.md), torch-free
so that the command line checks them before torch loads."""

POLICY_LOSSES = ("ppo-clip", "gspo", "cispo")
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
ADVANTAGE_ESTIMATORS = ("group-norm", "group-mean", "rloo", "reinforce-pp-baseline")
