// Pipeline schedules as data: every schedule for P 1..4, M 1..8, V 1..3 is valid, runs
// through, and idles exactly as its formula says; small cases are written out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "loom/core/error.h"
#include "loom/parallel/pipeline_schedule.h"
#include "loom/parallel/pipeline_stages.h"

namespace loom::parallel {
namespace {

std::string error_of(ScheduleKind k, int P, int M, int V, int A = 0) {
  try {
    make_schedule(k, P, M, V, A);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::string render(const StageActions& a) {
  std::string s;
  for (const PipelineAction& x : a) {
    s += (s.empty() ? "" : " ") + std::string(pass_name(x.pass)) + std::to_string(x.microbatch) +
         (x.chunk ? "." + std::to_string(x.chunk) : "");
  }
  return s;
}

TEST(PipelineSchedule, SmallCasesByHand) {
  auto g = make_schedule(ScheduleKind::kGPipe, 2, 3);
  EXPECT_EQ(render(g[0]), "F0 F1 F2 BW0 BW1 BW2");
  EXPECT_EQ(render(g[1]), "F0 F1 F2 BW0 BW1 BW2");
  auto o = make_schedule(ScheduleKind::kOneFOneB, 3, 4);  // warm-up 2, 1, 0
  EXPECT_EQ(render(o[0]), "F0 F1 F2 BW0 F3 BW1 BW2 BW3");
  EXPECT_EQ(render(o[1]), "F0 F1 BW0 F2 BW1 F3 BW2 BW3");
  EXPECT_EQ(render(o[2]), "F0 BW0 F1 BW1 F2 BW2 F3 BW3");
  // ZB-H1, P 2, M 3: the last stage runs W(m) after B(m+1); the bubble is one unit.
  auto z = make_schedule(ScheduleKind::kZeroBubbleH1, 2, 3);
  EXPECT_EQ(render(z[0]), "F0 F1 B0 W0 F2 B1 W1 B2 W2");
  EXPECT_EQ(render(z[1]), "F0 B0 F1 B1 W0 F2 B2 W1 W2");
  const ScheduleTiming t = simulate_schedule(z, 2, 1);
  EXPECT_EQ(t.makespan, 10);
  EXPECT_EQ(t.idle, (std::vector<double>{1, 1}));
  // Interleaved, P 2, M 2, V 2 (chunk c of stage s is virtual stage 2c + s): Megatron's
  // warm-up of (P-s-1)*2 + (V-1)*P = 4 and 2 forwards.
  auto i = make_schedule(ScheduleKind::kInterleaved, 2, 2, 2);
  EXPECT_EQ(render(i[0]), "F0 F1 F0.1 F1.1 BW0.1 BW1.1 BW0 BW1");
  EXPECT_EQ(render(i[1]), "F0 F1 F0.1 BW0.1 F1.1 BW1.1 BW0 BW1");
}

// Idle over busy time per stage, with unit costs, for every schedule and shape.
TEST(PipelineSchedule, EveryShapeIsValidAndIdlesAsTheFormulaSays) {
  int checked = 0;
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                         ScheduleKind::kZeroBubbleH1})
    for (int P = 1; P <= 4; ++P)
      for (int M = 1; M <= 8; ++M)
        for (int V = 1; V <= 3; ++V) {
          if (V > 1 && k != ScheduleKind::kInterleaved) continue;
          if (k == ScheduleKind::kInterleaved && M < P) continue;
          SCOPED_TRACE(std::string(schedule_name(k)) + " P " + std::to_string(P) + " M " +
                       std::to_string(M) + " V " + std::to_string(V));
          const auto s = make_schedule(k, P, M, V);
          ASSERT_EQ(validate_schedule(s, P, M, V), "");
          const ScheduleTiming t = simulate_schedule(s, P, V);
          ASSERT_FALSE(t.deadlock);
          const double one_f_one_b = static_cast<double>(P - 1) / M;
          const int peak = *std::max_element(t.peak_in_flight.begin(), t.peak_in_flight.end());
          switch (k) {
            case ScheduleKind::kGPipe:
              EXPECT_NEAR(t.bubble(), one_f_one_b, 1e-12);
              EXPECT_EQ(peak, M);
              break;
            case ScheduleKind::kOneFOneB:
              EXPECT_NEAR(t.bubble(), one_f_one_b, 1e-12);
              for (int p = 0; p < P; ++p) EXPECT_EQ(t.peak_in_flight[p], std::min(P - p, M));
              break;
            case ScheduleKind::kInterleaved:
              EXPECT_NEAR(t.bubble(), static_cast<double>(P - 1) / (M * V), 1e-12);
              break;
            case ScheduleKind::kZeroBubbleH1:
              if (M >= P)
                EXPECT_NEAR(t.bubble(), one_f_one_b / 3, 1e-12);
              else
                EXPECT_LE(t.bubble(), one_f_one_b + 1e-12);
              EXPECT_LE(peak, std::min(P, M));  // 1F1B's peak (its first stage)
              break;
          }
          ++checked;
        }
  EXPECT_EQ(checked, 4 * 8 + 4 * 8 + (8 + 7 + 6 + 5) * 3 + 4 * 8);
}

// Each action's own cost (a step's measured passes): with F, B and W unequal the schedules
// idle as their formulas in those costs say — 1F1B and GPipe (P-1)(F + BW) on every stage,
// ZB-H1 (P-1)(F + B - W) on its first stage (Qi et al.: the W's of the last P-1 microbatches
// fill the cool-down) — and a slower stage makes the others wait.
TEST(PipelineSchedule, MeasuredCostsIdleAsTheFormulasInThoseCosts) {
  const double F = 1.0, B = 1.3, W = 0.8;
  auto pass_cost = [&](Pass pass) {
    switch (pass) {
      case Pass::kF:
        return F;
      case Pass::kB:
        return B;
      case Pass::kW:
        return W;
      default:
        return B + W;  // BW
    }
  };
  auto costs_of = [&](const std::vector<StageActions>& s, double slow_first = 1.0) {
    ActionCosts c(s.size());
    for (size_t p = 0; p < s.size(); ++p)
      for (const PipelineAction& a : s[p])
        c[p].push_back((p == 0 ? slow_first : 1.0) * pass_cost(a.pass));
    return c;
  };
  for (int P = 2; P <= 4; ++P)
    for (int M = P; M <= 8; ++M) {
      SCOPED_TRACE("P " + std::to_string(P) + " M " + std::to_string(M));
      for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
        const auto s = make_schedule(k, P, M);
        const ScheduleTiming t = simulate_schedule(s, P, 1, costs_of(s));
        for (int p = 0; p < P; ++p) {
          EXPECT_NEAR(t.busy[p], M * (F + B + W), 1e-9);
          EXPECT_NEAR(t.idle[p], (P - 1) * (F + B + W), 1e-9);
        }
      }
      const auto z = make_schedule(ScheduleKind::kZeroBubbleH1, P, M);
      const ScheduleTiming t = simulate_schedule(z, P, 1, costs_of(z));
      EXPECT_NEAR(t.idle[0], (P - 1) * (F + B - W), 1e-9);
      // The first stage 10% slower: it idles less, the step grows and the others wait for it.
      const ScheduleTiming slow = simulate_schedule(z, P, 1, costs_of(z, 1.1));
      EXPECT_LT(slow.idle[0], t.idle[0]);
      EXPECT_GT(slow.makespan, t.makespan);
      for (int p = 1; p < P; ++p) EXPECT_GT(slow.idle[p], t.idle[p]);
    }
  // The unit-cost run and the per-action run agree when the costs are the units.
  const auto z = make_schedule(ScheduleKind::kZeroBubbleH1, 3, 6);
  ActionCosts unit(3);
  for (int p = 0; p < 3; ++p)
    for (const PipelineAction& a : z[p]) unit[p].push_back(a.pass == Pass::kBW ? 2.0 : 1.0);
  EXPECT_EQ(simulate_schedule(z, 3, 1, unit).idle, simulate_schedule(z, 3, 1).idle);
}

// pp.active_microbatches = A: every capped shape is valid, runs through, and no stage holds
// more than A microbatches; GPipe's rounds idle (P-1)/A when A divides M; a cap at or
// above the schedule's own peak changes nothing.
TEST(PipelineSchedule, ActiveMicrobatchesCapWhatAStageHolds) {
  int checked = 0;
  for (ScheduleKind k :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1})
    for (int P = 1; P <= 4; ++P)
      for (int M = 1; M <= 8; ++M)
        for (int A = 1; A <= M + 1; ++A) {
          SCOPED_TRACE(std::string(schedule_name(k)) + " P " + std::to_string(P) + " M " +
                       std::to_string(M) + " A " + std::to_string(A));
          const auto s = make_schedule(k, P, M, 1, A);
          ASSERT_EQ(validate_schedule(s, P, M, 1), "");
          const ScheduleTiming t = simulate_schedule(s, P, 1);
          ASSERT_FALSE(t.deadlock);
          for (int p = 0; p < P; ++p) EXPECT_LE(t.peak_in_flight[p], A);
          const auto uncapped = make_schedule(k, P, M, 1);
          const ScheduleTiming u = simulate_schedule(uncapped, P, 1);
          const int own = *std::max_element(u.peak_in_flight.begin(), u.peak_in_flight.end());
          for (int p = 0; p < P; ++p) {
            if (A >= own) {
              EXPECT_EQ(render(s[p]), render(uncapped[p]));
            } else if (t.peak_in_flight[p] < u.peak_in_flight[p]) {
              EXPECT_NE(render(s[p]), render(uncapped[p]));
            }
          }
          if (k == ScheduleKind::kGPipe && M % A == 0) {
            EXPECT_NEAR(t.bubble(), static_cast<double>(P - 1) / A, 1e-12);
          }
          if (k == ScheduleKind::kOneFOneB) {
            for (int p = 0; p < P; ++p) EXPECT_EQ(t.peak_in_flight[p], std::min({P - p, M, A}));
          }
          ++checked;
        }
  EXPECT_EQ(checked, 3 * 4 * (2 + 3 + 4 + 5 + 6 + 7 + 8 + 9));
  EXPECT_NE(
      error_of(ScheduleKind::kInterleaved, 2, 4, 2, 2).find("does not apply to the interleaved"),
      std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kOneFOneB, 2, 4, 1, -1).find("is negative"), std::string::npos);
}

TEST(PipelineSchedule, TheValidatorCatchesBrokenSchedules) {
  auto s = make_schedule(ScheduleKind::kOneFOneB, 2, 3);
  auto early = s;  // stage 0: F0 F1 BW0 ... -> BW0 F1 F0 ...
  std::swap(early[0][0], early[0][2]);
  EXPECT_NE(validate_schedule(early, 2, 3, 1).find("runs before its forward"), std::string::npos);
  auto dropped = s;
  dropped[1].pop_back();
  EXPECT_NE(validate_schedule(dropped, 2, 3, 1).find("exactly once"), std::string::npos);
  auto reordered = s;  // stage 1 consumes microbatches 1 and 0 in the wrong order
  reordered[1] = {{1, 0, Pass::kF},  {0, 0, Pass::kF}, {0, 0, Pass::kBW},
                  {1, 0, Pass::kBW}, {2, 0, Pass::kF}, {2, 0, Pass::kBW}};
  EXPECT_NE(validate_schedule(reordered, 2, 3, 1).find("received in another order"),
            std::string::npos);
  // A valid order whose stages wait on each other: stage 0 runs BW0 before F1, but stage 1
  // wants F1 before BW0 (it sends BW0's gradient only after F1).
  auto cyclic = s;
  cyclic[0] = {{0, 0, Pass::kF},  {0, 0, Pass::kBW}, {1, 0, Pass::kF},
               {1, 0, Pass::kBW}, {2, 0, Pass::kF},  {2, 0, Pass::kBW}};
  cyclic[1] = {{0, 0, Pass::kF},  {1, 0, Pass::kF}, {0, 0, Pass::kBW},
               {1, 0, Pass::kBW}, {2, 0, Pass::kF}, {2, 0, Pass::kBW}};
  EXPECT_EQ(validate_schedule(cyclic, 2, 3, 1), "");
  EXPECT_TRUE(simulate_schedule(cyclic, 2, 1).deadlock);
  // Head passes: one per microbatch, on stage 0, after its forward there, in the order of the
  // last stage's forwards and backwards.
  auto headed = s;
  add_head_passes(headed, 2, 1, {}, {1, 0});
  ASSERT_EQ(validate_schedule(headed, 2, 3, 1), "");
  auto on_last = headed;
  on_last[1].insert(on_last[1].begin() + 1, {0, 0, Pass::kH});
  EXPECT_NE(validate_schedule(on_last, 2, 3, 1).find("runs on stage 0"), std::string::npos);
  auto missing = headed;
  std::erase(missing[0], PipelineAction{2, 0, Pass::kH});
  EXPECT_NE(validate_schedule(missing, 2, 3, 1).find("of the 3 microbatches"), std::string::npos);
  auto twice = headed;
  twice[0].push_back({0, 0, Pass::kH});
  EXPECT_NE(validate_schedule(twice, 2, 3, 1).find("appears twice"), std::string::npos);
  auto before = headed;  // H0 ahead of stage 0's F0
  std::erase(before[0], PipelineAction{0, 0, Pass::kH});
  before[0].insert(before[0].begin(), {0, 0, Pass::kH});
  EXPECT_NE(validate_schedule(before, 2, 3, 1).find("runs before its forward"), std::string::npos);
  auto swapped = headed;  // H1 before H0
  auto h0 = std::find(swapped[0].begin(), swapped[0].end(), PipelineAction{0, 0, Pass::kH});
  auto h1 = std::find(swapped[0].begin(), swapped[0].end(), PipelineAction{1, 0, Pass::kH});
  std::iter_swap(h0, h1);
  EXPECT_NE(validate_schedule(swapped, 2, 3, 1).find("in another order"), std::string::npos);
  // Placed after the backward it unblocks: valid by order, but the stages wait on each other
  // (the placement is what prevents that).
  auto late = s;
  late[0] = {{0, 0, Pass::kF},  {1, 0, Pass::kF}, {0, 0, Pass::kBW},
             {0, 0, Pass::kH},  {2, 0, Pass::kF}, {1, 0, Pass::kH},
             {1, 0, Pass::kBW}, {2, 0, Pass::kH}, {2, 0, Pass::kBW}};
  EXPECT_EQ(validate_schedule(late, 2, 3, 1), "");
  EXPECT_TRUE(simulate_schedule(late, 2, 1, {}, {1, 0}).deadlock);
}

// The head split as schedule data: stage 0 takes a share of the head (H passes, placed where
// a run finds them ready) for every schedule and shape, and the result is valid and runs.
TEST(PipelineSchedule, HeadPassesArePlacedValidAndRunThrough) {
  int checked = 0;
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                         ScheduleKind::kZeroBubbleH1})
    for (int P = 2; P <= 4; ++P)
      for (int M = P; M <= 8; ++M) {
        const int V = k == ScheduleKind::kInterleaved ? 2 : 1;
        auto s = make_schedule(k, P, M, V);
        const size_t before = s[0].size();
        const ScheduleTiming placed = add_head_passes(s, P, V, {}, {0.7, 0});
        ASSERT_EQ(s[0].size(), before + M);
        ASSERT_EQ(validate_schedule(s, P, M, V), "")
            << schedule_name(k) << " P " << P << " M " << M;
        const ScheduleTiming t = simulate_schedule(s, P, V, {}, {0.7, 0});
        ASSERT_FALSE(t.deadlock);
        EXPECT_DOUBLE_EQ(t.makespan, placed.makespan);  // the placing run is this schedule's run
        EXPECT_DOUBLE_EQ(t.busy[0],
                         simulate_schedule(make_schedule(k, P, M, V), P, V).busy[0] + 0.7 * M);
        ++checked;
      }
  EXPECT_EQ(checked, 4 * (7 + 6 + 5));
  // 1F1B, P 2, M 3, unit costs, H 1: H(m) runs as soon as F(m) of the last stage is done
  // and stage 0 is free (H1 is ready at 6, while BW0 runs 5-7; at 7 it goes before F2).
  auto o = make_schedule(ScheduleKind::kOneFOneB, 2, 3);
  add_head_passes(o, 2, 1, {}, {1, 0});
  EXPECT_EQ(render(o[0]), "F0 F1 H0 BW0 H1 F2 BW1 H2 BW2");
  EXPECT_EQ(render(o[1]), "F0 BW0 F1 BW1 F2 BW2");
}

// What the split is for: `small`'s head (2VC per token forward) outweighs its six blocks, so
// today's best cut (the blocks on stage 0, the head alone on stage 1) idles stage 0. With a
// share r of the head's rows on stage 0 (H: its forward and backward, 3 r head) and k of the
// blocks, the best (k, r) shortens 1F1B's and ZB-H1's simulated step by a fifth (one rank's
// step / 1.88 and / 1.94, from / 1.50 and / 1.57), GPipe's by 6% (its H's lengthen the phase of
// forwards on stage 0).
TEST(PipelineSchedule, TheHeadSplitBalancesSmall) {
  const double C = 384, T = 256, Vocab = 50257;
  const double block = 24 * C * C + 4 * C * T, head = 2 * Vocab * C;  // forward, per token
  const double work = 8 * 3 * (6 * block + head);                     // one rank's step
  for (auto [k, gain] : {std::pair{ScheduleKind::kGPipe, 0.96},
                         {ScheduleKind::kOneFOneB, 0.82},
                         {ScheduleKind::kZeroBubbleH1, 0.82}}) {
    const auto now = simulate_schedule(make_schedule(k, 2, 8), 2, 1, {6 * block, head});
    double best = 1e300;
    for (int blocks = 1; blocks <= 5; ++blocks)
      for (int i = 1; i < 20; ++i) {
        const double r = i / 20.0;
        const std::vector<double> cost = {blocks * block, (6 - blocks) * block + (1 - r) * head};
        const HeadSplitCost share = {3 * r * head, (1 - r) * head};
        auto s = make_schedule(k, 2, 8);
        const double placed = add_head_passes(s, 2, 1, cost, share).makespan;
        const auto t = simulate_schedule(s, 2, 1, cost, share);
        ASSERT_FALSE(t.deadlock);
        ASSERT_DOUBLE_EQ(t.makespan, placed);
        best = std::min(best, t.makespan);
      }
    EXPECT_LT(best, gain * now.makespan) << schedule_name(k) << ": " << best / work << " vs "
                                         << now.makespan / work << " of one rank's step";
    EXPECT_GT(now.makespan, 0.6 * work) << schedule_name(k);
  }
}

// The head split's planner on `small`'s FLOP costs (pp.head_split): a share and a cut whose
// simulated step beats the unsplit one by the margin the search above finds, a valid
// schedule with it, and a given cut (pp.split) kept.
TEST(PipelineStages, TheHeadSplitPlanBalancesSmall) {
  const int rows = 4 * 256;
  const std::vector<double> costs = gpt_unit_costs(6, 384, 50257, 256);
  const double head = 6.0 * 50257 * 384;
  for (auto [k, gain] : {std::pair{ScheduleKind::kGPipe, 0.96},
                         {ScheduleKind::kOneFOneB, 0.82},
                         {ScheduleKind::kZeroBubbleH1, 0.82}})
    for (int P : {2, 4}) {
      SCOPED_TRACE(std::string(schedule_name(k)) + " pp " + std::to_string(P));
      const HeadSplitPlan plan = plan_head_split(costs, head, rows, k, P, 1, 8, 0);
      ASSERT_GT(plan.rows, 0);
      ASSERT_LT(plan.rows, rows);
      EXPECT_LT(plan.step, (P == 2 ? gain : 0.97) * plan.unsplit_step);
      ASSERT_EQ(static_cast<int>(plan.pieces.size()), P);
      EXPECT_EQ(plan.pieces.front().first, 0);
      EXPECT_EQ(plan.pieces.back().last, 7);
      for (int s = 1; s < P; ++s) EXPECT_EQ(plan.pieces[s].first, plan.pieces[s - 1].last + 1);
      auto sched = make_schedule(k, P, 8);
      const ScheduleTiming t = add_head_passes(sched, P, 1, plan.forward_cost, plan.cost);
      EXPECT_EQ(validate_schedule(sched, P, 8, 1), "");
      EXPECT_DOUBLE_EQ(t.makespan, plan.step);
      EXPECT_DOUBLE_EQ(plan.cost.head, head * plan.rows / rows);
    }
  // Interleaved, 2 chunks per stage: four pieces, stage 0 chunk 0 the embedding's.
  const HeadSplitPlan two =
      plan_head_split(costs, head, rows, ScheduleKind::kInterleaved, 2, 2, 8, 0);
  ASSERT_GT(two.rows, 0);
  EXPECT_LT(two.step, 0.9 * two.unsplit_step);
  ASSERT_EQ(two.pieces.size(), 4u);
  auto sched = make_schedule(ScheduleKind::kInterleaved, 2, 8, 2);
  EXPECT_DOUBLE_EQ(add_head_passes(sched, 2, 2, two.forward_cost, two.cost).makespan, two.step);
  EXPECT_EQ(validate_schedule(sched, 2, 8, 2), "");
  const std::vector<UnitRange> given = {{0, 4}, {5, 7}};
  const HeadSplitPlan kept =
      plan_head_split(costs, head, rows, ScheduleKind::kOneFOneB, 2, 1, 8, 0, given);
  EXPECT_EQ(kept.pieces, given);
  EXPECT_GT(kept.rows, 0);
}

TEST(PipelineSchedule, BadShapesAndNames) {
  EXPECT_NE(error_of(ScheduleKind::kInterleaved, 4, 3, 2)
                .find("needs at least as many microbatches as stages"),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kOneFOneB, 2, 4, 2).find("needs pp.schedule = \"interleaved\""),
            std::string::npos);
  EXPECT_NE(error_of(ScheduleKind::kGPipe, 2, 0, 1).find("at least 1"), std::string::npos);
  try {
    schedule_kind("zb-h3");
    ADD_FAILURE() << "zb-h3 accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("\"zb-h3\" is not a pipeline schedule"),
              std::string::npos);
  }
  EXPECT_EQ(schedule_kind("1f1b"), ScheduleKind::kOneFOneB);
}

// ---- stages ----

// The smallest possible largest piece, by trying every cut.
double brute_force_best(const std::vector<double>& c, int pieces) {
  const int n = static_cast<int>(c.size());
  double best = 1e300;
  std::function<void(int, int, double)> go = [&](int start, int left, double worst) {
    if (left == 1) {
      double sum = 0;
      for (int i = start; i < n; ++i) sum += c[i];
      best = std::min(best, std::max(worst, sum));
      return;
    }
    double sum = 0;
    for (int end = start + 1; end <= n - left + 1; ++end) {
      sum += c[end - 1];
      go(end, left - 1, std::max(worst, sum));
    }
  };
  go(0, pieces, 0);
  return best;
}

TEST(PipelineStages, BalancedSplitsAreOptimalAndContiguous) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 9), pieces = 1 + static_cast<int>(rng() % n);
    std::vector<double> c(n);
    for (auto& x : c) x = 1 + rng() % 20;
    const auto r = balance_units(c, pieces);
    ASSERT_EQ(static_cast<int>(r.size()), pieces);
    double worst = 0;
    for (int k = 0; k < pieces; ++k) {
      ASSERT_EQ(r[k].first, k ? r[k - 1].last + 1 : 0);
      ASSERT_GE(r[k].count(), 1);
      double sum = 0;
      for (int i = r[k].first; i <= r[k].last; ++i) sum += c[i];
      worst = std::max(worst, sum);
    }
    ASSERT_EQ(r.back().last, n - 1);
    ASSERT_DOUBLE_EQ(worst, brute_force_best(c, pieces)) << "trial " << trial;
  }
  // Equal blocks: the later stages take the extra block, the first holds the fewest.
  const auto r = balance_units({1, 10, 10, 10, 10, 10, 1}, 2);
  EXPECT_EQ(r, (std::vector<UnitRange>{{0, 2}, {3, 6}}));
}

// The largest per-stage sum of a cut into P x V pieces (stage s runs pieces s, s + P, ...).
double worst_stage(const std::vector<double>& c, const std::vector<UnitRange>& cut, int P) {
  std::vector<double> sum(P, 0);
  for (size_t k = 0; k < cut.size(); ++k)
    for (int u = cut[k].first; u <= cut[k].last; ++u) sum[k % P] += c[u];
  return *std::max_element(sum.begin(), sum.end());
}

// The interleaved cut balances each stage's sum of chunks: V = 1 is the linear partition,
// never worse than balancing pieces, and on `small`'s shape (a head worth ~10 blocks) the
// optimum found by trying every cut.
TEST(PipelineStages, InterleavedCutsBalanceStageSums) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 4 + static_cast<int>(rng() % 12), P = 1 + static_cast<int>(rng() % 3);
    const int V = 1 + static_cast<int>(rng() % 3);
    if (n < P * V) continue;
    std::vector<double> c(n);
    for (double& x : c) x = 1 + static_cast<double>(rng() % 20);
    const auto pieces = balance_units(c, P * V), stages = balance_stages(c, P, V);
    ASSERT_EQ(stages.size(), static_cast<size_t>(P * V));
    for (size_t k = 0; k < stages.size(); ++k) {  // consecutive, non-empty, covering
      EXPECT_EQ(stages[k].first, k == 0 ? 0 : stages[k - 1].last + 1);
      EXPECT_GE(stages[k].count(), 1);
    }
    EXPECT_EQ(stages.back().last, n - 1);
    if (V == 1) {
      EXPECT_EQ(stages, pieces);
    }
    EXPECT_LE(worst_stage(c, stages, P), worst_stage(c, pieces, P) + 1e-9);
  }
  // Against every cut of 8 units into 4 pieces: `small`'s shape (a head worth ~10 blocks,
  // where balancing pieces happens to be optimal too) and one where it is not.
  auto optimum = [](const std::vector<double>& c) {
    double best = 1e300;
    for (int a = 1; a < 8; ++a)
      for (int b = a + 1; b < 8; ++b)
        for (int d = b + 1; d < 8; ++d)
          best = std::min(best, worst_stage(c, {{0, a - 1}, {a, b - 1}, {b, d - 1}, {d, 7}}, 2));
    return best;
  };
  const std::vector<double> small = gpt_unit_costs(6, 384, 50257, 256);
  EXPECT_DOUBLE_EQ(worst_stage(small, balance_stages(small, 2, 2), 2), optimum(small));
  const std::vector<double> uneven = {1, 4, 4, 1, 8, 1, 1, 8};
  EXPECT_DOUBLE_EQ(worst_stage(uneven, balance_stages(uneven, 2, 2), 2), optimum(uneven));
  EXPECT_DOUBLE_EQ(optimum(uneven), 14);
  EXPECT_GT(worst_stage(uneven, balance_units(uneven, 4), 2), 14);
}

TEST(PipelineStages, GptCostsSplitsAndNames) {
  // gpt2-124m at T 1024: the tied head (6 V C) costs ~4.5 blocks, so the last stage of 2
  // gets fewer blocks.
  const auto costs = gpt_unit_costs(12, 768, 50257, 1024);
  ASSERT_EQ(costs.size(), 14u);
  const auto r = balance_units(costs, 2);
  EXPECT_EQ(r, (std::vector<UnitRange>{{0, 8}, {9, 13}}));
  EXPECT_EQ(describe_stages(r, 12),
            "stage 0: embedding, blocks 0-7; stage 1: blocks 8-11, final norm and head");
  EXPECT_EQ(describe_stages(split_units({1, 2, 1}, 4, 3), 2),
            "stage 0: embedding; stage 1: blocks 0-1; stage 2: final norm and head");
  auto error = [](auto f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error([] {
              balance_units(std::vector<double>(4, 1.0), 5);
            }).find("cannot cut the model's 4 units"),
            std::string::npos);
  EXPECT_NE(error([] {
              split_units({2, 1}, 4, 2);
            }).find("pp.split = [2, 1] does not cut the model's 4 units into 2 stages"),
            std::string::npos);
  EXPECT_NE(error([] { split_units({4, 0}, 4, 2); }).find("does not cut"), std::string::npos);
}

}  // namespace
}  // namespace loom::parallel
