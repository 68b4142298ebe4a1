// The rank layout of data (D), pipeline (P) and tensor (T) parallelism, as a pure function
// (Megatron's RankGenerator; SageMaker model parallel's placement_strategy).
//
// world = dp x pp x tp; dp is inferred. The placement is an order of the three letters in
// which the RIGHTMOST letter varies fastest over neighbouring ranks: rank = sum over the
// letters of coordinate x stride, the rightmost letter's stride 1, each other letter's the
// product of the sizes to its right. "cluster" (the default) = "DPT": a tensor-parallel group
// is tp adjacent ranks, inside one machine when ranks are placed machine by machine;
// "spread" = "TPD": a data-parallel group is adjacent instead. (Megatron writes its orders
// the other way round: SMP "DPT" = Megatron "tp-pp-dp".)
//
// Worked example, world 8, tp 2, pp 2, dp 2, "DPT" (strides D 4, P 2, T 1):
//   rank  0 1 2 3 4 5 6 7
//   dp    0 0 0 0 1 1 1 1
//   pp    0 0 1 1 0 0 1 1
//   tp    0 1 0 1 0 1 0 1
//   tp groups [0 1] [2 3] [4 5] [6 7]; pp groups [0 2] [1 3] [4 6] [5 7];
//   dp groups [0 4] [1 5] [2 6] [3 7]; embedding groups (first and last stage) = pp groups.
#pragma once

#include <string>
#include <vector>

namespace loom::parallel {

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const MeshCoord&) const = default;
};

class Mesh {
 public:
  // UserError naming the numbers when tp x pp does not divide the world, a size is < 1, or
  // the placement is not "cluster", "spread" or a permutation of D, P and T.
  static Mesh build(int world, int tp, int pp, const std::string& placement = "cluster");

  int world() const { return world_; }
  int dp() const { return size_[kD]; }
  int pp() const { return size_[kP]; }
  int tp() const { return size_[kT]; }
  const std::string& order() const { return order_; }  // resolved: "DPT", "TPD", ...

  MeshCoord coord(int rank) const;
  int rank_of(MeshCoord c) const;
  // The members of rank's group along `dim` ('D', 'P' or 'T'): the ranks that share every
  // other coordinate with it, in the order of their coordinate along dim (so a rank's index
  // in the group is its coordinate).
  std::vector<int> group(char dim, int rank) const;
  // Every group along dim, ordered by their first member.
  std::vector<std::vector<int>> groups(char dim) const;
  // The ranks of the first and last pipeline stage with rank's dp and tp coordinates (they
  // hold the tied embedding); {rank} when pp == 1; empty for a rank on a middle stage.
  std::vector<int> embedding_group(int rank) const;
  // "world 4 = dp 2 x pp 1 x tp 2, placement DPT; tp groups [0 1] [2 3]; dp groups [0 2] [1 3]"
  // (groups of size 1 are left out).
  std::string describe() const;

 private:
  enum Dim { kD, kP, kT };
  static int dim_index(char d);
  int coord_along(int rank, int d) const { return rank / stride_[d] % size_[d]; }

  int world_ = 1;
  std::string order_ = "DPT";
  int size_[3] = {1, 1, 1};
  int stride_[3] = {1, 1, 1};
};

}  // namespace loom::parallel
