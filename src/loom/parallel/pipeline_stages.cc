#include "loom/parallel/pipeline_stages.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::parallel {

// best[k][i]: the smallest largest-piece cost of cutting units [0, i) into k pieces
// (linear partition, O(n^2 k) for the few dozen units of a model); then, knowing the
// optimum, pieces are filled from the back.
std::vector<UnitRange> balance_units(const std::vector<double>& costs, int pieces) {
  const int n = static_cast<int>(costs.size());
  if (pieces < 1 || pieces > n)
    throw UserError(
        "cannot cut the model's " + std::to_string(n) + " units (embedding, " +
            std::to_string(n - 2) + " blocks, final norm) into " + std::to_string(pieces) +
            " pipeline stages",
        "use at most " + std::to_string(n) + " stages in all (train.pp x pp.virtual_stages)");
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(pieces + 1, std::vector<double>(n + 1, kInf));
  best[0][0] = 0;
  for (int k = 1; k <= pieces; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j)
        best[k][i] = std::min(best[k][i], std::max(best[k - 1][j], prefix[i] - prefix[j]));
  const double limit = best[pieces][n] * (1 + 1e-12);
  std::vector<UnitRange> out(pieces);
  int end = n;  // units [0, end) are left for pieces 0..k
  for (int k = pieces - 1; k >= 0; --k) {
    int first = end - 1;
    while (first > k && prefix[end] - prefix[first - 1] <= limit) --first;
    out[k] = {first, end - 1};
    end = first;
  }
  LOOM_CHECK_EQ(end, 0);
  return out;
}

std::vector<UnitRange> balance_stages(const std::vector<double>& costs, int P, int V) {
  std::vector<UnitRange> cut = balance_units(costs, P * V);
  if (V == 1) return cut;
  const int S = P * V, n = static_cast<int>(costs.size());
  std::vector<double> prefix(n + 1, 0);
  for (int u = 0; u < n; ++u) prefix[u + 1] = prefix[u] + costs[u];
  // starts[k]: the first unit of piece k (starts[0] = 0); piece k ends before starts[k + 1].
  std::vector<int> starts(S + 1);
  for (int k = 0; k < S; ++k) starts[k] = cut[k].first;
  starts[S] = n;
  auto score = [&](const std::vector<int>& b) {
    std::vector<double> sum(P, 0);
    for (int k = 0; k < S; ++k) sum[k % P] += prefix[b[k + 1]] - prefix[b[k]];
    double worst = 0, squares = 0;
    for (double x : sum) worst = std::max(worst, x), squares += x * x;
    return std::pair{worst, squares};
  };
  auto best = score(starts);
  for (bool moved = true; moved;) {
    moved = false;
    for (int k = 1; k < S; ++k)
      for (int d : {-1, 1}) {
        std::vector<int> b = starts;
        b[k] += d;
        if (b[k] <= b[k - 1] || b[k] >= b[k + 1]) continue;  // pieces stay non-empty
        const auto s = score(b);
        if (s.first < best.first - 1e-9 ||
            (s.first < best.first + 1e-9 && s.second < best.second - 1e-9)) {
          starts = b, best = s, moved = true;
        }
      }
  }
  for (int k = 0; k < S; ++k) cut[k] = {starts[k], starts[k + 1] - 1};
  return cut;
}

std::vector<UnitRange> split_units(const std::vector<int>& counts, int units, int pieces) {
  int sum = 0;
  for (int c : counts) sum += c;
  const bool positive = std::all_of(counts.begin(), counts.end(), [](int c) { return c >= 1; });
  if (static_cast<int>(counts.size()) != pieces || sum != units || !positive) {
    std::string list;
    for (int c : counts) list += (list.empty() ? "" : ", ") + std::to_string(c);
    throw UserError("pp.split = [" + list + "] does not cut the model's " + std::to_string(units) +
                        " units into " + std::to_string(pieces) + " stages",
                    "give " + std::to_string(pieces) +
                        " unit counts of at least 1 that add up to " + std::to_string(units) +
                        " (the embedding, each block and the final norm are one unit each)");
  }
  std::vector<UnitRange> out;
  for (int first = 0; int c : counts) {
    out.push_back({first, first + c - 1});
    first += c;
  }
  return out;
}

std::vector<double> gpt_unit_costs(int n_layer, int n_embd, int vocab, int seq_len) {
  const double C = n_embd;
  std::vector<double> costs = {C};
  for (int l = 0; l < n_layer; ++l) costs.push_back(6 * 12 * C * C + 12 * C * seq_len);
  costs.push_back(6.0 * vocab * C + 10 * C);
  return costs;
}

HeadSplitPlan plan_head_split(const std::vector<double>& costs, double head, int rows,
                              ScheduleKind kind, int P, int V, int M, int active_microbatches,
                              const std::vector<UnitRange>& fixed) {
  LOOM_CHECK(P >= 2 && V >= 1 && rows >= 2 && !costs.empty() && head <= costs.back());
  constexpr int kSteps = 32;
  const int VS = P * V;
  HeadSplitPlan best;
  int tried = -1;
  for (int i = 0; i < kSteps; ++i) {
    const int h = static_cast<int>(std::lround(static_cast<double>(i) * rows / kSteps));
    if (h == tried || h >= rows) continue;  // few rows: the same h twice
    tried = h;
    const double share = head * h / rows;  // the H passes' cost (forward and backward)
    std::vector<UnitRange> pieces = fixed;
    if (pieces.empty()) {  // the share moves with the embedding: stage 0 carries it
      std::vector<double> moved = costs;
      moved.front() += share, moved.back() -= share;
      pieces = balance_stages(moved, P, V);
    }
    std::vector<double> forward(VS, 0.0);
    for (int v = 0; v < VS; ++v)
      for (int u = pieces[v].first; u <= pieces[v].last; ++u) forward[v] += costs[u] / 3;
    forward[VS - 1] -= share / 3;
    const HeadSplitCost cost{share, (head - share) / 3};
    std::vector<StageActions> sched = make_schedule(kind, P, M, V, active_microbatches);
    const ScheduleTiming t = h == 0 ? simulate_schedule(sched, P, V, forward)
                                    : add_head_passes(sched, P, V, forward, cost);
    if (t.deadlock) continue;
    if (h == 0) best.unsplit_step = t.makespan;
    if (h == 0 || t.makespan < best.step)
      best = {pieces, h, forward, cost, t.makespan, best.unsplit_step};
  }
  return best;
}

std::string describe_stages(const std::vector<UnitRange>& pieces, int n_layer) {
  std::string s;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const UnitRange& r = pieces[k];
    std::vector<std::string> parts;
    if (r.first == 0) parts.push_back("embedding");
    const int b0 = std::max(r.first, 1) - 1, b1 = std::min(r.last, n_layer) - 1;
    if (b0 <= b1)
      parts.push_back(b0 == b1 ? "block " + std::to_string(b0)
                               : "blocks " + std::to_string(b0) + "-" + std::to_string(b1));
    if (r.last == n_layer + 1) parts.push_back("final norm and head");
    std::string what;
    for (const auto& p : parts) what += (what.empty() ? "" : ", ") + p;
    s += (k ? "; " : "") + std::string("stage ") + std::to_string(k) + ": " + what;
  }
  return s;
}

}  // namespace loom::parallel
