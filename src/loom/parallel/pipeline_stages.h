// Which units each pipeline stage runs: the model's units (embedding, blocks, final norm
// with the tied head and the loss) cut into S = P x V consecutive pieces ("virtual stages":
// chunk c of stage s is piece c*P + s), the first piece starting with the embedding and
// the last ending with the final norm. A pure function of the units' costs.
#pragma once

#include <string>
#include <vector>

#include "loom/parallel/pipeline_schedule.h"

namespace loom::parallel {

struct UnitRange {
  int first = 0, last = 0;  // inclusive
  int count() const { return last - first + 1; }
  bool operator==(const UnitRange&) const = default;
};

// The split of `costs.size()` units into `pieces` consecutive non-empty ranges whose
// largest total cost is as small as it can be. Among such splits the later pieces take as
// many units as fit, so the first stage — which holds the most microbatches in a 1F1B
// pipeline — gets the fewest. UserError naming the numbers when there are fewer units
// than pieces.
std::vector<UnitRange> balance_units(const std::vector<double>& costs, int pieces);

// The interleaved schedule's cut: P x V pieces whose largest per-stage sum (stage s runs
// pieces s, s + P, ...) is small, not the largest piece — a stage's chunks run one after
// another, so its sum is what the pipeline waits for. From balance_units' cut, boundaries
// move one unit at a time while that lowers the largest stage sum (then the spread of the
// sums): a local optimum, never worse than balance_units'. V = 1 is balance_units.
std::vector<UnitRange> balance_stages(const std::vector<double>& costs, int P, int V);

// `counts` (pp.split: units per piece, in order) as ranges; UserError when they do not add
// up to the unit count, one is < 1, or there are not `pieces` of them.
std::vector<UnitRange> split_units(const std::vector<int>& counts, int units, int pieces);

// A GPT's unit costs from its FLOP count per token (forward + backward): the embedding a
// lookup (counted as C), each block 6 x 12C^2 + 12 C T, the final unit its LayerNorm and the
// tied head's 6 V C.
std::vector<double> gpt_unit_costs(int n_layer, int n_embd, int vocab, int seq_len);

// The head split's plan (pp.head_split): how many of each microbatch's `rows` rows stage 0
// runs the head for, and the cut into P x V pieces, chosen together by the schedule's
// simulated step (add_head_passes) with these unit costs, the last unit's `head` of them the
// tied head's (gpt_unit_costs: 6 V C). Candidates: rows in steps of rows/32; for each, the
// cut balance_stages makes with the share's cost moved from the last unit to the embedding —
// or `fixed` (pp.split) for every one. rows = 0 when no share beats the schedule without it.
struct HeadSplitPlan {
  std::vector<UnitRange> pieces;
  int rows = 0;
  std::vector<double> forward_cost;   // per virtual stage: forward (cost / 3), the share out
  HeadSplitCost cost;                 // an H pass's and the last stage's own share
  double step = 0, unsplit_step = 0;  // simulated, in the costs' units
};
HeadSplitPlan plan_head_split(const std::vector<double>& costs, double head, int rows,
                              ScheduleKind kind, int P, int V, int M, int active_microbatches,
                              const std::vector<UnitRange>& fixed = {});

// "stage 0: units 0-3 (embedding, blocks 0-2), stage 1: units 4-7 (blocks 3-5, final norm)"
std::string describe_stages(const std::vector<UnitRange>& pieces, int n_layer);

}  // namespace loom::parallel
