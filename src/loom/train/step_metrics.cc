#include "loom/train/step_metrics.h"

#include <algorithm>

namespace loom::train {

namespace metrics = profile::metrics;

void RankMetrics::gather(const Gather& all_ranks) {
  all_ = all_ranks(std::vector<double>(mine_.begin(), mine_.end()));
  ranks_ = static_cast<int>(all_.size() / metrics::kPerRankCount);
}

double RankMetrics::max_over_ranks(PerRank f) const {
  double m = 0;
  for (int q = 0; q < ranks_; ++q) m = std::max(m, at(q, f));
  return m;
}

void RankMetrics::write(nlohmann::json& line) const {
  for (size_t i = 0; i < metrics::kPerRankCount; ++i) {
    if (absent_.test(i)) continue;
    nlohmann::json values = nlohmann::json::array();
    for (int q = 0; q < ranks_; ++q) values.push_back(at(q, static_cast<PerRank>(i)));
    line[metrics::kPerRankFields[i].key] = std::move(values);
  }
}

void RankMetrics::add_scalars(std::vector<std::pair<std::string, double>>& scalars) const {
  for (int q = 0; q < ranks_; ++q)
    for (size_t i = 0; i < metrics::kPerRankCount; ++i)
      if (!absent_.test(i) && metrics::kPerRankFields[i].tensorboard)
        scalars.push_back(
            {std::string(metrics::kPerRankFields[i].tensorboard) + "/rank" + std::to_string(q),
             at(q, static_cast<PerRank>(i))});
}

}  // namespace loom::train
