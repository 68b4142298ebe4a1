// One step's per-rank metrics (profile/metrics_fields.h names them): each rank sets its
// values, one allgather brings every rank's values to every rank, and rank 0 writes them
// into the step's metrics.jsonl line and TensorBoard.
#pragma once

#include <array>
#include <bitset>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/profile/metrics_fields.h"

namespace loom::train {

class RankMetrics {
 public:
  using PerRank = profile::metrics::PerRank;
  // A rank-major allgather over every rank of the job.
  using Gather = std::function<std::vector<double>(const std::vector<double>&)>;

  void set(PerRank f, double v) { mine_[index(f)] = v; }
  // The field does not apply to this layout: the line leaves it out.
  void leave_out(PerRank f) { absent_.set(index(f)); }
  // Collective: every rank calls it after setting its values.
  void gather(const Gather& all_ranks);
  int ranks() const { return ranks_; }
  double at(int rank, PerRank f) const {
    return all_[static_cast<size_t>(rank) * profile::metrics::kPerRankCount + index(f)];
  }
  double max_over_ranks(PerRank f) const;
  // The gathered fields as arrays (one value per rank) into a metrics.jsonl line, and as
  // TensorBoard scalars (the fields that have a tag, one per rank).
  void write(nlohmann::json& line) const;
  void add_scalars(std::vector<std::pair<std::string, double>>& scalars) const;

 private:
  static size_t index(PerRank f) { return static_cast<size_t>(f); }
  std::array<double, profile::metrics::kPerRankCount> mine_{};
  std::bitset<profile::metrics::kPerRankCount> absent_;
  std::vector<double> all_;  // rank-major, kPerRankCount per rank
  int ranks_ = 0;
};

}  // namespace loom::train
