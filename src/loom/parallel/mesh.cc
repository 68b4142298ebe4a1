#include "loom/parallel/mesh.h"

#include <algorithm>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::parallel {

int Mesh::dim_index(char d) {
  switch (d) {
    case 'D':
      return kD;
    case 'P':
      return kP;
    case 'T':
      return kT;
  }
  LOOM_CHECK_MSG(false, std::string("not a mesh dimension: ") + d);
  return -1;
}

Mesh Mesh::build(int world, int tp, int pp, const std::string& placement) {
  if (tp < 1 || pp < 1 || world < 1)
    throw UserError("train.tp = " + std::to_string(tp) + ", train.pp = " + std::to_string(pp) +
                        " on " + std::to_string(world) + " ranks: sizes must be at least 1",
                    "set train.tp and train.pp to positive integers");
  if (world % (tp * pp) != 0)
    throw UserError("train.tp = " + std::to_string(tp) + " x train.pp = " + std::to_string(pp) +
                        " = " + std::to_string(tp * pp) + " does not divide the " +
                        std::to_string(world) + " ranks",
                    "start a multiple of tp x pp ranks, or change train.tp / train.pp");
  Mesh m;
  m.world_ = world;
  std::string order = placement;
  std::transform(order.begin(), order.end(), order.begin(), ::toupper);
  if (placement == "cluster") order = "DPT";
  if (placement == "spread") order = "TPD";
  std::string sorted = order;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != "DPT") {
    std::string bad;
    for (char c : order)
      if (c != 'D' && c != 'P' && c != 'T') bad += c;
    throw UserError("train.placement = \"" + placement + "\" is not a placement" +
                        (bad.empty() ? std::string(" (each of D, P, T exactly once)")
                                     : " (unknown letter '" + bad.substr(0, 1) + "')"),
                    "use \"cluster\" (= DPT), \"spread\" (= TPD) or another order of the letters "
                    "D, P, T; the rightmost varies fastest over neighbouring ranks");
  }
  m.order_ = order;
  m.size_[kT] = tp, m.size_[kP] = pp, m.size_[kD] = world / (tp * pp);
  int stride = 1;
  for (int i = 2; i >= 0; --i) {
    const int d = dim_index(order[i]);
    m.stride_[d] = stride;
    stride *= m.size_[d];
  }
  return m;
}

MeshCoord Mesh::coord(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_);
  return {coord_along(rank, kD), coord_along(rank, kP), coord_along(rank, kT)};
}

int Mesh::rank_of(MeshCoord c) const {
  return c.dp * stride_[kD] + c.pp * stride_[kP] + c.tp * stride_[kT];
}

std::vector<int> Mesh::group(char dim, int rank) const {
  const int d = dim_index(dim);
  const int first = rank - coord_along(rank, d) * stride_[d];
  std::vector<int> g;
  for (int i = 0; i < size_[d]; ++i) g.push_back(first + i * stride_[d]);
  return g;
}

std::vector<std::vector<int>> Mesh::groups(char dim) const {
  std::vector<std::vector<int>> all;
  for (int r = 0; r < world_; ++r)
    if (coord_along(r, dim_index(dim)) == 0) all.push_back(group(dim, r));
  return all;
}

std::vector<int> Mesh::embedding_group(int rank) const {
  const MeshCoord c = coord(rank);
  if (pp() == 1) return {rank};
  if (c.pp != 0 && c.pp != pp() - 1) return {};
  return {rank_of({c.dp, 0, c.tp}), rank_of({c.dp, pp() - 1, c.tp})};
}

std::string Mesh::describe() const {
  std::string s = "world " + std::to_string(world_) + " = dp " + std::to_string(dp()) + " x pp " +
                  std::to_string(pp()) + " x tp " + std::to_string(tp()) + ", placement " + order_;
  for (char dim : {'T', 'P', 'D'}) {
    if (size_[dim_index(dim)] == 1) continue;
    s += std::string("; ") + static_cast<char>(::tolower(dim)) + "p groups";
    for (const auto& g : groups(dim)) {
      s += " [";
      for (size_t i = 0; i < g.size(); ++i) s += (i ? " " : "") + std::to_string(g[i]);
      s += "]";
    }
  }
  return s;
}

}  // namespace loom::parallel
