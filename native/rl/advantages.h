// Advantage estimators of outcome rewards (docs/algorithms.md): one advantage per sample, from
// its prompt's group of samples and, for REINFORCE++'s baseline, the whole iteration.
#pragma once

#include <vector>

namespace moerl::rl {

enum class AdvantageEstimator {
  GroupNorm,  // GRPO: (r - mean) / (std + 1e-6), population std
  GroupMean,  // Dr.GRPO: r - mean
  Rloo,       // leave-one-out: r - mean of the others = n / (n - 1) (r - mean)
  ReinforcePpBaseline,  // REINFORCE++ with the group mean as baseline, whitened over the batch
};

// One prompt's group of rewards and, per sample, its trained completion tokens (the weight of
// the batch whitening).
struct RewardGroup {
  std::vector<float> rewards;
  std::vector<int> trained_tokens;
};

// Per group, its samples' advantages, or an empty vector for a group whose rewards are all equal
// (std < 1e-6): it carries no signal and is not trained on. ReinforcePpBaseline whitens r - mean
// over every sample of the kept groups, each weighted by its trained tokens.
std::vector<std::vector<float>> advantages(const std::vector<RewardGroup>& groups,
                                           AdvantageEstimator estimator);

}  // namespace moerl::rl
