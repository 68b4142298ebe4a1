// Pipeline schedules as data (DESIGN decision 6): each schedule is a pure function that
// returns, for every pipeline stage, the ordered list of actions it runs in one optimizer
// step; one executor runs any list, and the tests check the lists themselves.
//
// P stages (ranks of a pipeline group), M microbatches, V chunks per stage ("virtual
// stages": chunk c of stage s is virtual stage c*P + s; the model's units are cut into P*V
// consecutive pieces). An action is (microbatch, chunk, pass):
//   F  forward of the chunk for the microbatch;
//   BW the whole backward (input and weight gradients) — GPipe, 1F1B, interleaved;
//   B  the input gradient only, and W the weight gradient only — zero-bubble schedules,
//      which run B on the critical path and defer W into the bubbles;
//   H  the head split (pp.head_split; make_schedule does not emit it, add_head_passes adds
//      it): stage 0, which holds the tied embedding, runs the head's forward and backward
//      over a share of microbatch m's rows. H(m) reads the final
//      norm's output of F(m) on the last virtual stage and sends its input gradient to
//      B/BW(m) there, over a channel of its own (last stage -> stage 0 and back).
// Dependencies: F(m, v) needs F(m, v-1); B/BW(m, v) needs F(m, v) and B/BW(m, v+1);
// W(m, v) needs B(m, v); with H passes, H(m) needs F(m, last) and B/BW(m, last) needs H(m).
// Messages between neighbouring stages (activations forward, gradients backward) travel on
// two channels; on each channel and direction a receiver consumes messages in the order its
// sender produced them (checked by validate_schedule), so a FIFO transport with receives
// posted ahead runs any valid schedule without deadlock.
//
//   gpipe        all F, then all BW (both in microbatch order): M microbatches in flight.
//   1f1b         Megatron's PipeDream-flush order: stage s runs min(P-s-1, M) warm-up F,
//                then alternates F and BW, then the remaining BW: at most P-s in flight.
//   interleaved  Megatron's interleaved 1F1B over V chunks, microbatches in groups of P
//                (the last group takes the remainder, so any M >= P works): warm-up
//                (P-s-1)*2 + (V-1)*P forwards (longer when the last group is larger), then
//                one forward and one backward at a time.
//   zb-h1        Qi et al. (2023) ZB-H1: 1F1B's order of F and B, W split off and run by
//                stage s after the B of the microbatch s later, so the W's fill the waits
//                of 1F1B's cool-down; a stage holds at most P microbatches (from F to W),
//                the peak 1F1B reaches on its first stage.
// Bubble share (idle over busy time per stage, unit action costs), checked by the tests:
// (P-1)/M for gpipe and 1f1b, (P-1)/(M*V) for interleaved, (P-1)/(3M) for zb-h1 with
// M >= P — a third of 1f1b's.
//
// A cap of A active microbatches (pp.active_microbatches; 0 = the schedule's own) bounds
// what a stage holds: gpipe runs rounds of A microbatches (all F of a round, then its BW;
// bubble (P-1)/A when A divides M), 1f1b warms stage s up with min(P-s, A)-1 forwards,
// zb-h1 also defers W's only as far as A allows. Interleaved takes no cap.
#pragma once

#include <string>
#include <vector>

namespace loom::parallel {

enum class Pass { kF, kBW, kB, kW, kH };
const char* pass_name(Pass p);  // "F", "BW", "B", "W", "H"

struct PipelineAction {
  int microbatch = 0;
  int chunk = 0;
  Pass pass = Pass::kF;
  bool operator==(const PipelineAction&) const = default;
};

using StageActions = std::vector<PipelineAction>;

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kZeroBubbleH1 };

// "gpipe", "1f1b", "interleaved", "zb-h1"; UserError naming the alternatives otherwise.
ScheduleKind schedule_kind(const std::string& name);
const char* schedule_name(ScheduleKind kind);

// The actions of every stage, at most A microbatches held per stage (A = 0: no cap).
// UserError naming the numbers for P, M or V < 1, V > 1 with a schedule other than
// interleaved, interleaved with M < P or with a cap, or A < 0.
std::vector<StageActions> make_schedule(ScheduleKind kind, int P, int M, int V = 1, int A = 0);

// "" when the schedule is valid: every (microbatch, chunk) has one F and either one BW or
// one B and one W, all on its stage; each backward after its forward and each W after its B
// on that stage; H passes, if any, one per microbatch on stage 0 (P >= 2), each after that
// stage's F of the microbatch; and on each channel the receiver's order equals the
// sender's. Otherwise what is wrong, naming the stage and the action.
std::string validate_schedule(const std::vector<StageActions>& s, int P, int M, int V);

// The head split's costs: an H pass's time on stage 0, and the last virtual stage's own share
// of the head's forward (part of its forward_cost), which its F runs after it has sent the
// head's input — so H(m) can start that long before F(m, last) ends — and whose backward
// (as long again in B, twice in BW) its B/BW(m) runs before it needs H(m)'s gradient.
struct HeadSplitCost {
  double head = 0, last_share = 0;
};

// The schedule run with unit costs (F = B = W = 1/V, BW = 2/V; transfers free; a stage waits
// when its next action's input is not there yet), or with `forward_cost[v]` per virtual
// stage v = chunk * P + stage (B = W = F, BW = 2F) when given (the planner's seconds); H
// passes as `head` says.
struct ScheduleTiming {
  bool deadlock = false;            // some stage waits for an action that never runs
  double makespan = 0;              // the step
  std::vector<double> busy, idle;   // per stage; idle = makespan - busy
  std::vector<int> peak_in_flight;  // per stage: most microbatch-chunks held (F run, BW/W not)
  // Idle over busy time, the largest over the stages ((P-1)/M for 1f1b).
  double bubble() const;
};
ScheduleTiming simulate_schedule(const std::vector<StageActions>& s, int P, int V,
                                 const std::vector<double>& forward_cost = {},
                                 HeadSplitCost head = {});
// The schedule run with each action's own cost: costs[p][i] for s[p][i] — a step's measured
// passes, their waits for input left out — so its idle is what the schedule itself makes of
// those passes when transfers are free (an H's input counts when the last stage's F ends).
using ActionCosts = std::vector<std::vector<double>>;
ScheduleTiming simulate_schedule(const std::vector<StageActions>& s, int P, int V,
                                 const ActionCosts& costs);

// The head split's placement: puts H(m) for every microbatch into stage 0's list (P >= 2),
// in the order the last stage runs F(m, last), each where a run with these costs (as in
// simulate_schedule) finds it ready — ahead of the list's next action unless that one
// could start earlier — so the last stage waits for it as little as the costs allow. The
// run is a witness that the order cannot deadlock. Returns that run's timing.
ScheduleTiming add_head_passes(std::vector<StageActions>& s, int P, int V,
                               const std::vector<double>& forward_cost, HeadSplitCost head);

}  // namespace loom::parallel
