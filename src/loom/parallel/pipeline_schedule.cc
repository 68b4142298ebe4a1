#include "loom/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <set>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::parallel {

namespace {

struct Key {
  int m, c;
  auto operator<=>(const Key&) const = default;
};

PipelineAction F(int m, int c = 0) {
  return {m, c, Pass::kF};
}
PipelineAction BW(int m, int c = 0) {
  return {m, c, Pass::kBW};
}

// In rounds of A microbatches (A = M: one round), all F of a round, then its BW.
std::vector<StageActions> gpipe(int P, int M, int A) {
  std::vector<StageActions> s(P);
  for (int p = 0; p < P; ++p)
    for (int g = 0; g < M; g += A) {
      for (int m = g; m < std::min(M, g + A); ++m) s[p].push_back(F(m));
      for (int m = g; m < std::min(M, g + A); ++m) s[p].push_back(BW(m));
    }
  return s;
}

// Warm-up forwards, then forward/backward pairs, then the remaining backwards; `fwd` and
// `bwd` are the stage's forward and backward orders (1F1B and interleaved differ only in
// them and in the warm-up count).
StageActions warmup_steady_cooldown(const std::vector<std::pair<int, int>>& fwd,
                                    const std::vector<std::pair<int, int>>& bwd, int warmup) {
  StageActions a;
  const int total = static_cast<int>(fwd.size());
  warmup = std::min(warmup, total);
  for (int i = 0; i < warmup; ++i) a.push_back(F(fwd[i].first, fwd[i].second));
  for (int i = warmup; i < total; ++i) {  // steady: one forward, one backward
    a.push_back(F(fwd[i].first, fwd[i].second));
    const auto& b = bwd[i - warmup];
    a.push_back(BW(b.first, b.second));
  }
  for (int i = total - warmup; i < total; ++i) a.push_back(BW(bwd[i].first, bwd[i].second));
  return a;
}

// Stage s holds min(P - s, A) microbatches at most: its warm-up is one fewer.
std::vector<StageActions> one_f_one_b(int P, int M, int A) {
  std::vector<std::pair<int, int>> order;
  for (int m = 0; m < M; ++m) order.push_back({m, 0});
  std::vector<StageActions> s(P);
  for (int p = 0; p < P; ++p) s[p] = warmup_steady_cooldown(order, order, std::min(P - p, A) - 1);
  return s;
}

// Microbatches in groups of P (the last group takes the remainder, P..2P-1 of them); within
// a group every chunk in turn (forward: chunks up, backward: chunks down), so a group's
// microbatches move through the virtual stages as a wave. Stage s runs Megatron's warm-up
// of (P-s-1)*2 + (V-1)*P forwards, then alternates forward and backward. A larger last
// group needs a longer warm-up (else a backward would come before its forward, or the
// stages would wait on each other): every stage's warm-up grows one forward at a time until
// the schedule is valid and runs through. That keeps the bubble at (P-1)/(M*V) for every
// M >= P, at the price of up to (M mod P)*V more chunks held; Megatron requires P | M.
std::vector<StageActions> interleaved(int P, int M, int V) {
  std::vector<std::pair<int, int>> fwd, bwd;
  for (int g = 0, end; g < M; g = end) {
    end = M - g < 2 * P ? M : g + P;
    for (int c = 0; c < V; ++c)
      for (int m = g; m < end; ++m) fwd.push_back({m, c});
    for (int c = V - 1; c >= 0; --c)
      for (int m = g; m < end; ++m) bwd.push_back({m, c});
  }
  std::vector<StageActions> s(P);
  for (int extra = 0;; ++extra) {
    for (int p = 0; p < P; ++p)
      s[p] = warmup_steady_cooldown(fwd, bwd, (P - p - 1) * 2 + (V - 1) * P + extra);
    if (validate_schedule(s, P, M, V).empty() && !simulate_schedule(s, P, V).deadlock) return s;
    LOOM_CHECK_MSG(extra <= M * V, "no valid interleaved schedule");
  }
}

// ZB-H1: 1F1B's order of forwards and input-gradient backwards, with stage s running the
// weight gradient of microbatch m after the B of microbatch m + s (the remaining W at the
// end). Later stages, which in 1F1B wait longest for the next gradient, thus hold W's to
// fill those waits; stage s holds at most (P-s) + s = P microbatches (F run, W not), the
// peak 1F1B reaches on its first stage. Capped at A, stage s holds min(P - s, A) from F to
// B and defers its W's by at most what is left of A.
std::vector<StageActions> zero_bubble_h1(int P, int M, int A) {
  std::vector<StageActions> s = one_f_one_b(P, M, A);
  for (int p = 0; p < P; ++p) {
    const int defer = std::max(0, std::min(p, A - std::min(P - p, A)));
    StageActions a;
    int next_w = 0;
    for (const PipelineAction& x : s[p]) {
      if (x.pass == Pass::kF) {
        a.push_back(x);
        continue;
      }
      a.push_back({x.microbatch, 0, Pass::kB});
      if (x.microbatch - defer >= 0) a.push_back({next_w++, 0, Pass::kW});
    }
    while (next_w < M) a.push_back({next_w++, 0, Pass::kW});
    s[p] = std::move(a);
  }
  return s;
}

}  // namespace

const char* pass_name(Pass p) {
  const char* names[] = {"F", "BW", "B", "W", "H"};
  return names[static_cast<int>(p)];
}

ScheduleKind schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zb-h1") return ScheduleKind::kZeroBubbleH1;
  throw UserError("pp.schedule = \"" + name + "\" is not a pipeline schedule",
                  "use gpipe, 1f1b, interleaved or zb-h1");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
  }
  return "?";
}

std::vector<StageActions> make_schedule(ScheduleKind kind, int P, int M, int V, int A) {
  const std::string shape = "pipeline of " + std::to_string(P) + " stages, " + std::to_string(M) +
                            " microbatches, " + std::to_string(V) + " chunks per stage";
  if (P < 1 || M < 1 || V < 1)
    throw UserError(shape + ": every count must be at least 1",
                    "set train.pp, pp.microbatches and pp.virtual_stages to 1 or more");
  if (V > 1 && kind != ScheduleKind::kInterleaved)
    throw UserError(shape + ": pp.virtual_stages > 1 needs pp.schedule = \"interleaved\"",
                    "set pp.virtual_stages = 1, or use the interleaved schedule");
  if (A < 0)
    throw UserError(
        shape + ": pp.active_microbatches = " + std::to_string(A) + " is negative",
        "set it to 0 (the schedule's own) or to the most microbatches a stage may hold");
  if (A > 0 && kind == ScheduleKind::kInterleaved)
    throw UserError(shape + ": pp.active_microbatches does not apply to the interleaved schedule",
                    "leave pp.active_microbatches at 0, or cap memory with 1f1b, zb-h1 or gpipe");
  const int cap = A == 0 || A >= M ? 1 << 30 : A;  // A >= M: no cap
  switch (kind) {
    case ScheduleKind::kGPipe:
      return gpipe(P, M, cap);
    case ScheduleKind::kOneFOneB:
      return one_f_one_b(P, M, cap);
    case ScheduleKind::kInterleaved:
      if (M < P)
        throw UserError(shape +
                            ": the interleaved schedule needs at least as many "
                            "microbatches as stages",
                        "raise pp.microbatches to " + std::to_string(P) + " or more, or use 1f1b");
      return V == 1 ? one_f_one_b(P, M, M) : interleaved(P, M, V);
    case ScheduleKind::kZeroBubbleH1:
      return zero_bubble_h1(P, M, cap);
  }
  return {};
}

std::string validate_schedule(const std::vector<StageActions>& s, int P, int M, int V) {
  if (static_cast<int>(s.size()) != P)
    return "the schedule has " + std::to_string(s.size()) + " stages, expected " +
           std::to_string(P);
  auto name = [](int p, const PipelineAction& a) {
    return "stage " + std::to_string(p) + " " + pass_name(a.pass) + "(microbatch " +
           std::to_string(a.microbatch) + ", chunk " + std::to_string(a.chunk) + ")";
  };
  std::vector<int> heads;  // the microbatches of stage 0's H passes, in order
  for (int p = 0; p < P; ++p) {
    std::map<Key, std::set<Pass>> seen;
    for (const PipelineAction& a : s[p]) {
      if (a.microbatch < 0 || a.microbatch >= M || a.chunk < 0 || a.chunk >= V)
        return name(p, a) + " is out of range";
      if (a.pass == Pass::kH) {  // then the checks below: once, after its F
        if (p != 0 || P < 2 || a.chunk != 0)
          return name(p, a) + ": the head's share runs on stage 0 (chunk 0) of a pipeline";
        heads.push_back(a.microbatch);
      }
      auto& passes = seen[{a.microbatch, a.chunk}];
      if (passes.count(a.pass)) return name(p, a) + " appears twice";
      const bool has_f = passes.count(Pass::kF) > 0;
      if (a.pass != Pass::kF && !has_f) return name(p, a) + " runs before its forward";
      if (a.pass == Pass::kW && !passes.count(Pass::kB)) return name(p, a) + " runs before its B";
      if ((a.pass == Pass::kB || a.pass == Pass::kW) && passes.count(Pass::kBW))
        return name(p, a) + " mixes a whole backward with a split one";
      passes.insert(a.pass);
    }
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < V; ++c) {
        const auto& passes = seen[{m, c}];
        const bool whole = passes.count(Pass::kBW) > 0;
        const bool split = passes.count(Pass::kB) > 0 && passes.count(Pass::kW) > 0;
        if (!passes.count(Pass::kF) || whole == split)
          return "stage " + std::to_string(p) + " does not run microbatch " + std::to_string(m) +
                 " chunk " + std::to_string(c) + " forward and backward exactly once";
      }
  }
  // Channels: activations from virtual stage v to v+1, gradients from v+1 to v. The sender
  // of an activation is F(m, v), its receiver F(m, v+1); of a gradient B/BW(m, v+1) and
  // B/BW(m, v). On each (sender stage, receiver stage, kind) the orders must agree.
  const int VS = P * V;
  std::map<std::tuple<int, int, int>, std::vector<Key>> sent, received;
  for (int p = 0; p < P; ++p)
    for (const PipelineAction& a : s[p]) {
      const int v = a.chunk * P + p;
      const bool backward = a.pass == Pass::kB || a.pass == Pass::kBW;
      if (a.pass == Pass::kF) {
        if (v + 1 < VS) sent[{p, (v + 1) % P, 0}].push_back({a.microbatch, v});
        if (v > 0) received[{(v - 1) % P, p, 0}].push_back({a.microbatch, v - 1});
      } else if (backward) {
        if (v > 0) sent[{p, (v - 1) % P, 1}].push_back({a.microbatch, v});
        if (v + 1 < VS) received[{(v + 1) % P, p, 1}].push_back({a.microbatch, v + 1});
      }
    }
  for (const auto& [channel, order] : sent) {
    const auto& [from, to, kind] = channel;
    if (from == to) continue;  // the next virtual stage is on the same rank: no message
    if (received[channel] != order)
      return std::string(kind ? "gradients" : "activations") + " from stage " +
             std::to_string(from) + " to stage " + std::to_string(to) +
             " are received in another order than they are sent";
  }
  if (heads.empty()) return "";
  if (static_cast<int>(heads.size()) != M)
    return "stage 0 runs the head's share of " + std::to_string(heads.size()) + " of the " +
           std::to_string(M) + " microbatches";
  // The head's channel: the last stage sends each F(m, last)'s final norm output, stage 0
  // answers each H(m) with its input gradient, which B/BW(m, last) receives.
  std::vector<int> forwards, backwards;
  for (const PipelineAction& a : s[P - 1]) {
    if (a.chunk != V - 1) continue;
    if (a.pass == Pass::kF) forwards.push_back(a.microbatch);
    if (a.pass == Pass::kB || a.pass == Pass::kBW) backwards.push_back(a.microbatch);
  }
  if (forwards != heads)
    return "stage 0 runs the head's shares in another order than the last stage's forwards";
  if (backwards != heads)
    return "the last stage's backwards take the head's gradients in another order than stage 0 "
           "sends them";
  return "";
}

double ScheduleTiming::bubble() const {
  double worst = 0;
  for (size_t p = 0; p < busy.size(); ++p) worst = std::max(worst, idle[p] / busy[p]);
  return worst;
}

namespace {

// Runs the lists: an action starts when its stage is free and its inputs are done. Those
// times do not depend on the order a run visits the stages in, only on the lists. With
// `placed_list`, stage 0 also holds the H passes not placed yet, in the order of the last
// stage's forwards, and starts the next one whenever it can start no later than its list's
// next action; the order it ran goes to `placed_list`. That run goes in time order — each
// step starts, over all stages, the action that can start earliest (ties to the lower
// stage) — which makes "no later than" exact (an input not simulated yet cannot be done
// before the earliest start that is), up to the head's overlaps, which let an input count a
// little before its producer ends: there a placement may come out later than the earliest,
// still valid (the run is its witness).
ScheduleTiming run(const std::vector<StageActions>& s, int P, int V,
                   const std::vector<double>& forward_cost, HeadSplitCost head,
                   StageActions* placed_list, const ActionCosts* action_costs = nullptr) {
  const bool place = placed_list != nullptr;
  const int VS = P * V;
  LOOM_CHECK(forward_cost.empty() || static_cast<int>(forward_cost.size()) == VS);
  LOOM_CHECK(!action_costs || (!place && static_cast<int>(action_costs->size()) == P));
  for (int p = 0; action_costs && p < P; ++p) LOOM_CHECK((*action_costs)[p].size() == s[p].size());
  // The cost of action i of stage p.
  auto cost = [&](int p, size_t i) {
    if (action_costs) return (*action_costs)[p][i];
    const PipelineAction& a = s[p][i];
    if (a.pass == Pass::kH) return head.head;
    const int v = a.chunk * P + p;
    return (a.pass == Pass::kBW ? 2.0 : 1.0) * (forward_cost.empty() ? 1.0 / V : forward_cost[v]);
  };
  // When each (pass, microbatch, virtual stage) finished; B and BW count as "backward".
  std::map<std::tuple<int, int, int>, double> done;
  auto pass_id = [](Pass p) {
    return p == Pass::kF ? 0 : p == Pass::kW ? 2 : p == Pass::kH ? 3 : 1;
  };
  bool split = place;
  for (const auto& a : s)
    for (const PipelineAction& x : a) split = split || x.pass == Pass::kH;
  std::vector<int> pending;  // H's to place
  if (place)
    for (const PipelineAction& x : s[P - 1])
      if (x.pass == Pass::kF && x.chunk == V - 1) pending.push_back(x.microbatch);
  size_t placed = 0;
  ScheduleTiming t;
  t.busy.assign(P, 0), t.idle.assign(P, 0), t.peak_in_flight.assign(P, 0);
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0);
  std::vector<int> held(P, 0);
  size_t remaining = pending.size();
  for (const auto& a : s) remaining += a.size();
  // When action a of stage p can start, or -1 while an input is not done.
  auto start_of = [&](int p, const PipelineAction& a) {
    const int v = a.chunk * P + p;
    double ready = free_at[p];
    // `early`: how long before its end the input may arrive (the head's shares overlap).
    auto need = [&](int pass, int vv, double early = 0) {
      auto it = done.find({pass, a.microbatch, vv});
      if (it == done.end()) return false;
      ready = std::max(ready, it->second - early);
      return true;
    };
    bool ok = true;
    if (a.pass == Pass::kF && v > 0) ok = need(0, v - 1);
    if (a.pass == Pass::kB || a.pass == Pass::kBW)
      ok = need(0, v) &&
           (v + 1 < VS ? need(1, v + 1)
                       : !split || need(3, 0, (a.pass == Pass::kBW ? 2 : 1) * head.last_share));
    if (a.pass == Pass::kW) ok = need(1, v);
    if (a.pass == Pass::kH) ok = need(0, VS - 1, head.last_share);
    return ok ? ready : -1.0;
  };
  // Runs `a` on stage p at `at`, for `seconds`.
  auto execute = [&](int p, const PipelineAction& a, double at, double seconds) {
    const int v = a.pass == Pass::kH ? 0 : a.chunk * P + p;
    const double end = at + seconds;
    done[{pass_id(a.pass), a.microbatch, v}] = end;
    free_at[p] = end;
    t.busy[p] += seconds;
    if (a.pass == Pass::kF) t.peak_in_flight[p] = std::max(t.peak_in_flight[p], ++held[p]);
    if (a.pass == Pass::kBW || a.pass == Pass::kW) --held[p];
    if (place && p == 0) placed_list->push_back(a);
    --remaining;
  };
  if (!place) {
    // Dependency order, cheaper (the planner runs this for every layout it weighs): each
    // stage runs on while its next action's inputs are done.
    for (bool progress = true; remaining > 0 && progress;) {
      progress = false;
      for (int p = 0; p < P; ++p)
        for (double at; next[p] < s[p].size() && (at = start_of(p, s[p][next[p]])) >= 0;) {
          execute(p, s[p][next[p]], at, cost(p, next[p]));
          ++next[p], progress = true;
        }
    }
  }
  while (place && remaining > 0) {
    int best_p = -1;
    bool best_h = false;
    double best = 0;
    for (int p = 0; p < P; ++p) {
      if (next[p] < s[p].size()) {
        const double at = start_of(p, s[p][next[p]]);
        if (at >= 0 && (best_p < 0 || at < best)) best_p = p, best = at, best_h = false;
      }
      if (p == 0 && placed < pending.size()) {
        const double at = start_of(0, {pending[placed], 0, Pass::kH});
        if (at >= 0 && (best_p < 0 || at <= best)) best_p = 0, best = at, best_h = true;
      }
    }
    if (best_p < 0) break;  // deadlock
    if (best_h)
      execute(0, {pending[placed++], 0, Pass::kH}, best, head.head);
    else
      execute(best_p, s[best_p][next[best_p]], best, cost(best_p, next[best_p])), ++next[best_p];
  }
  t.deadlock = remaining > 0;
  for (int p = 0; p < P; ++p) t.makespan = std::max(t.makespan, free_at[p]);
  for (int p = 0; p < P; ++p) t.idle[p] = t.makespan - t.busy[p];
  LOOM_CHECK_MSG(!place || !t.deadlock,
                 "the head's shares could not be placed: the schedule deadlocks");
  return t;
}

}  // namespace

ScheduleTiming simulate_schedule(const std::vector<StageActions>& s, int P, int V,
                                 const std::vector<double>& forward_cost, HeadSplitCost head) {
  return run(s, P, V, forward_cost, head, nullptr);
}

ScheduleTiming simulate_schedule(const std::vector<StageActions>& s, int P, int V,
                                 const ActionCosts& costs) {
  return run(s, P, V, {}, {}, nullptr, &costs);
}

ScheduleTiming add_head_passes(std::vector<StageActions>& s, int P, int V,
                               const std::vector<double>& forward_cost, HeadSplitCost head) {
  LOOM_CHECK_MSG(P >= 2, "the head split needs a pipeline of at least two stages");
  for (const auto& a : s)
    for (const PipelineAction& x : a)
      LOOM_CHECK_MSG(x.pass != Pass::kH, "the schedule has its head passes already");
  StageActions first;
  const ScheduleTiming t = run(s, P, V, forward_cost, head, &first);
  s[0] = std::move(first);
  return t;
}

}  // namespace loom::parallel
