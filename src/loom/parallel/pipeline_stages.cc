#include "loom/parallel/pipeline_stages.h"

#include <algorithm>
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
