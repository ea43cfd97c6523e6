// Advantage estimators: per-group statistics, then REINFORCE++'s whitening over the batch.
#include "rl/advantages.h"

#include <cmath>  // std::sqrt

namespace moerl::rl {

std::vector<std::vector<float>> advantages(const std::vector<RewardGroup>& groups,
                                           AdvantageEstimator estimator) {
  std::vector<std::vector<float>> out(groups.size());
  for (size_t g = 0; g < groups.size(); g++) {
    const std::vector<float>& r = groups[g].rewards;
    // each x / n in float32, accumulated in float64: the trainers agree on this to the bit
    double mean = 0.0, var = 0.0;
    for (float x : r) mean += x / r.size();
    for (float x : r) var += (x - mean) * (x - mean) / r.size();
    const double sd = std::sqrt(var);
    if (sd < 1e-6) continue;
    const double n = (double)r.size();
    for (float x : r) {
      switch (estimator) {
        case AdvantageEstimator::GroupNorm: out[g].push_back((float)((x - mean) / (sd + 1e-6))); break;
        case AdvantageEstimator::GroupMean:
        case AdvantageEstimator::ReinforcePpBaseline: out[g].push_back((float)(x - mean)); break;
        case AdvantageEstimator::Rloo: out[g].push_back((float)((x - mean) * n / (n - 1.0))); break;
      }
    }
  }
  if (estimator != AdvantageEstimator::ReinforcePpBaseline) return out;
  // token-weighted mean and population variance of the kept samples' advantages
  double w_sum = 0.0, mean = 0.0, var = 0.0;
  for (size_t g = 0; g < groups.size(); g++)
    for (size_t k = 0; k < out[g].size(); k++) {
      w_sum += groups[g].trained_tokens[k];
      mean += (double)groups[g].trained_tokens[k] * out[g][k];
    }
  if (w_sum <= 0.0) return out;
  mean /= w_sum;
  for (size_t g = 0; g < groups.size(); g++)
    for (size_t k = 0; k < out[g].size(); k++) {
      const double d = out[g][k] - mean;
      var += (double)groups[g].trained_tokens[k] * d * d / w_sum;
    }
  for (size_t g = 0; g < groups.size(); g++)
    for (float& a : out[g]) a = (float)((a - mean) / std::sqrt(var + 1e-8));
  return out;
}

}  // namespace moerl::rl
