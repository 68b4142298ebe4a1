// Pipeline schedules as data: every schedule for P 1..4, M 1..8, V 1..3 is valid, runs
// through, and idles exactly as its formula says; small cases are written out by hand.
#include <gtest/gtest.h>

#include <algorithm>

#include "loom/core/error.h"
#include "loom/parallel/pipeline_schedule.h"

namespace loom::parallel {
namespace {

std::string error_of(ScheduleKind k, int P, int M, int V) {
  try {
    make_schedule(k, P, M, V);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::string render(const StageActions& a) {
  std::string s;
  for (const PipelineAction& x : a) {
    const char* pass[] = {"F", "BW", "B", "W"};
    s += (s.empty() ? "" : " ") + std::string(pass[static_cast<int>(x.pass)]) +
         std::to_string(x.microbatch) + (x.chunk ? "." + std::to_string(x.chunk) : "");
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

}  // namespace
}  // namespace loom::parallel
