#include "loom/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "loom/core/check.h"
#include "loom/core/error.h"
#include "loom/profile/trace.h"

namespace loom::parallel {
using loom::DType;

PipelineStage::PipelineStage(model::Gpt& model, std::shared_ptr<comm::Communicator> pp,
                             std::vector<UnitRange> pieces, ScheduleKind kind, int microbatches,
                             int active_microbatches, HeadSplit head)
    : model_(model),
      pp_(std::move(pp)),
      pieces_(std::move(pieces)),
      M_(microbatches),
      head_rows_(head.rows) {
  LOOM_CHECK_MSG(pp_ && pp_->size() > 1, "a pipeline needs at least two stages");
  P_ = pp_->size();
  stage_ = pp_->rank();
  LOOM_CHECK(!pieces_.empty() && pieces_.size() % P_ == 0);
  V_ = static_cast<int>(pieces_.size()) / P_;
  schedule_ = make_schedule(kind, P_, M_, V_, active_microbatches);
  if (head_rows_ > 0) {
    add_head_passes(schedule_, P_, V_, head.forward_cost, head.cost);  // checks: no deadlock
    head_grads_.resize(M_);
  }
  const std::string wrong = validate_schedule(schedule_, P_, M_, V_);
  LOOM_CHECK_MSG(wrong.empty(), wrong);
  // The links virtual stage transitions cross, created in one order on every rank.
  const int VS = P_ * V_;
  std::set<std::tuple<int, int, int>> needed;
  for (int v = 0; v + 1 < VS; ++v)
    if (v % P_ != (v + 1) % P_) {
      needed.insert({kActivation, v % P_, (v + 1) % P_});
      needed.insert({kGradient, (v + 1) % P_, v % P_});
    }
  if (head_rows_ > 0) {
    needed.insert({kHeadInput, P_ - 1, 0});
    needed.insert({kHeadGrad, 0, P_ - 1});
  }
  links_.resize(kKinds * P_ * P_);
  int index = 0;
  for (const auto& [kind_, from, to] : needed) {
    const bool member = stage_ == from || stage_ == to;
    auto c = pp_->split(member ? index : -1, stage_ == from ? 0 : 1);
    if (member) links_[(kind_ * P_ + from) * P_ + to].comm = std::move(c);
    ++index;
  }
  acts_.resize(M_);
  for (auto& a : acts_) a.resize(V_);
  pool_.resize(V_);
}

model::Activations& PipelineStage::hold(int m, int chunk) {
  auto& slot = acts_[m][chunk];
  auto& pool = pool_[chunk];
  if (!slot) {
    if (pool.empty()) {
      // The forward allocates its buffers afresh: the offloader's spares go first, so memory
      // holds this microbatch and at most one being written, not a third kept for later.
      if (offload_) offload_->drop_spares();
      slot = std::make_unique<model::Activations>();
    } else {
      slot = std::move(pool.back());
      pool.pop_back();
      // Its buffers may still be going out to a neighbour.
      auto it = sending_from_.find(slot.get());
      if (it != sending_from_.end()) {
        const auto t0 = std::chrono::steady_clock::now();
        for (auto& w : it->second) w->wait();
        wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        sending_from_.erase(it);
      }
    }
  }
  return *slot;
}

void PipelineStage::release(int m, int chunk, int next_forward_chunk) {
  auto a = std::move(acts_[m][chunk]);
  // With offload, the pool keeps one microbatch for a forward of its chunk that comes next
  // (fresh buffers cost page faults); other finished microbatches' buffers leave memory (pooled,
  // every read-back buffer would stay until the next step's forwards: GPipe's backward phase would
  // hold them all again) as soon as no send reads them.
  if (!offload_ || (next_forward_chunk == chunk && pool_[chunk].empty())) {
    pool_[chunk].push_back(std::move(a));
    return;
  }
  retiring_.push_back(std::move(a));
  sweep_retiring();
}

void PipelineStage::sweep_retiring() {
  std::erase_if(retiring_, [&](const std::unique_ptr<model::Activations>& a) {
    auto it = sending_from_.find(a.get());
    if (it == sending_from_.end()) return true;
    if (!std::all_of(it->second.begin(), it->second.end(), [](auto& w) { return w->test(); }))
      return false;
    sending_from_.erase(it);
    return true;  // freed; hold() makes a new one
  });
}

void PipelineStage::note_peak() {
  size_t bytes = 0, block_bytes = 0;  // held microbatches' buffers now in memory
  for (int m = 0; m < M_; ++m)
    for (int c = 0; c < V_; ++c) {
      const auto& a = acts_[m][c];
      if (!a) continue;
      // An offloaded one's buffers belong to the I/O thread until fetched; it knows how
      // much of it is in memory (the write not done yet, or read back).
      if (offload_ && offload_->is_out(m * V_ + c)) {
        bytes += offload_->resident_bytes(m * V_ + c);
        continue;
      }
      bytes += a->bytes(), block_bytes += a->block_bytes();
    }
  for (const auto& pool : pool_)
    for (const auto& a : pool) bytes += a->bytes();  // idle buffers are memory too
  for (const auto& a : retiring_) bytes += a->bytes();
  if (offload_) bytes += offload_->spare_bytes();
  peak_bytes_ = std::max(peak_bytes_, bytes);
  peak_block_bytes_ = std::max(peak_block_bytes_, block_bytes);
}

std::vector<int> PipelineStage::units() const {
  std::set<int> u;
  for (int c = 0; c < V_; ++c)
    for (int x = pieces_[c * P_ + stage_].first; x <= pieces_[c * P_ + stage_].last; ++x)
      u.insert(x);
  if (last()) u.insert(0);  // the tied head reads wte
  return {u.begin(), u.end()};
}

PipelineStage::Link* PipelineStage::link(Kind kind, int from, int to) {
  Link* l = &links_[(kind * P_ + from) * P_ + to];
  LOOM_CHECK_MSG(
      l->comm, "no pipeline link from stage " + std::to_string(from) + " to " + std::to_string(to));
  return l;
}

const float* PipelineStage::receive(Kind kind, int from, size_t n) {
  Link* l = link(kind, from, stage_);
  l->staging.resize(n);
  const auto t0 = std::chrono::steady_clock::now();
  l->comm->recv(l->staging.data(), n, DType::kF32, 0);
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return l->staging.data();
}

void PipelineStage::send(Kind kind, int to, const float* data, size_t n,
                         const model::Activations* owner) {
  sends_.push_back(link(kind, stage_, to)->comm->send_async(data, n, DType::kF32, 1));
  if (owner) sending_from_[owner].push_back(sends_.back());
}

void PipelineStage::wait_sends() {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& w : sends_) w->wait();
  sends_.clear();
  sending_from_.clear();
  retiring_.clear();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// F(m, chunk): the input comes from the previous virtual stage (a receive, or this rank's
// previous chunk when there is one stage), the output goes to the next.
double PipelineStage::forward_action(int m, int chunk, const int* tokens, const int* targets, int B,
                                     int T, PipelineHooks* hooks, bool training) {
  const int v = chunk * P_ + stage_, VS = P_ * V_;
  const size_t n = static_cast<size_t>(model_.rows(B, T)) * model_.config().n_embd;
  model::Activations& a = hold(m, chunk);
  const float* input = v > 0 ? receive(kActivation, (v - 1) % P_, n) : nullptr;
  const size_t off = static_cast<size_t>(m) * B * T;
  if (hooks) hooks->before_forward();
  const double loss = model_.forward_units(a, pieces_[v].first, pieces_[v].last, tokens + off,
                                           targets ? targets + off : nullptr, B, T, input,
                                           training && v == VS - 1 ? head_share(a) : nullptr);
  if (hooks) hooks->after_action();
  if (v + 1 < VS) send(kActivation, (v + 1) % P_, model_.output(a), n, &a);
  return loss;
}

const model::HeadShare* PipelineStage::head_share(const model::Activations& a) {
  if (head_rows_ == 0) return nullptr;
  const size_t n = static_cast<size_t>(head_rows_) * model_.config().n_embd;
  share_.rows = head_rows_;
  share_.norm_ready = [this, n, &a](const float* lnf) { send(kHeadInput, 0, lnf, n, &a); };
  share_.input_grad = [this, n] { return receive(kHeadGrad, 0, n); };
  return &share_;
}

// H(m) on stage 0: the head's share of microbatch m's rows, from the final norm's output the
// last stage sent; the rows' input gradient goes back.
double PipelineStage::head_action(int m, const int* targets, int B, int T, float scale,
                                  PipelineHooks* hooks) {
  const size_t n = static_cast<size_t>(head_rows_) * model_.config().n_embd;
  const float* ln = receive(kHeadInput, P_ - 1, n);
  std::vector<float>& dln = head_grads_[m];
  dln.resize(n);
  if (hooks) hooks->before_backward(false);  // the tied embedding's last use is stage 0's B/W
  const double loss = model_.head_share(ln, targets + static_cast<size_t>(m) * B * T, head_rows_,
                                        B * T, scale, dln.data());
  if (hooks) hooks->after_action();
  send(kHeadGrad, P_ - 1, dln.data(), n, nullptr);  // dln lives until the step ends
  return loss;
}

double PipelineStage::train_step(const int* tokens, const int* targets, int B, int T, float scale,
                                 PipelineHooks* hooks) {
  const int VS = P_ * V_;
  const size_t n = static_cast<size_t>(model_.rows(B, T)) * model_.config().n_embd;
  double loss = 0;
  const StageActions& list = schedule_[stage_];
  action_s_.assign(list.size(), 0.0);
  // Times action i, less what it waited for a neighbour, into action_s_[i].
  struct ActionClock {
    double& out;
    const double& wait_s;
    const double wait0 = wait_s;
    const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~ActionClock() {
      out = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
            (wait_s - wait0);
    }
  };
  if (hooks) hooks->step_begins(true);
  for (size_t i = 0; i < list.size(); ++i) {
    const PipelineAction& x = list[i];
    const ActionClock clock{action_s_[i], wait_s_};
    const int v = x.chunk * P_ + stage_, key = x.microbatch * V_ + x.chunk;
    if (offload_) {
      sweep_retiring();
      // Bring back what the next `horizon_` backwards need.
      for (size_t j = i + 1; j < list.size() && j <= i + horizon_; ++j)
        if (list[j].pass == Pass::kB || list[j].pass == Pass::kBW)
          if (auto& held = acts_[list[j].microbatch][list[j].chunk])
            offload_->prefetch(list[j].microbatch * V_ + list[j].chunk, *held);
    }
    TraceSpan span{Trace::on()
                       ? std::string(pass_name(x.pass)) + " " + std::to_string(x.microbatch) +
                             (V_ > 1 ? "." + std::to_string(x.chunk) : "")
                       : std::string(),
                   "pipeline"};
    if (x.pass == Pass::kH) {
      loss += head_action(x.microbatch, targets, B, T, scale, hooks);
      continue;
    }
    if (x.pass == Pass::kF) {
      loss += forward_action(x.microbatch, x.chunk, tokens, targets, B, T, hooks, true);
      note_peak();
      const bool backward_next = i + 1 < list.size() && list[i + 1].pass != Pass::kF &&
                                 list[i + 1].microbatch == x.microbatch &&
                                 list[i + 1].chunk == x.chunk;
      if (offload_ && !backward_next) {  // it waits in the pipeline: out of memory meanwhile
        model::Activations& a = *acts_[x.microbatch][x.chunk];
        offload_->offload(key, a, model_.output(a));
        offload_->limit_backlog(static_cast<size_t>(horizon_));
      }
      continue;
    }
    const float* dout = nullptr;
    if (x.pass != Pass::kW && v + 1 < VS) dout = receive(kGradient, (v + 1) % P_, n);
    model::Activations& a = *acts_[x.microbatch][x.chunk];
    if (offload_ && x.pass != Pass::kW) offload_->fetch(key, a);
    const model::BackwardPart part = x.pass == Pass::kBW  ? model::BackwardPart::kWhole
                                     : x.pass == Pass::kB ? model::BackwardPart::kInput
                                                          : model::BackwardPart::kWeight;
    // A unit's gradients are final after the last microbatch's BW or W.
    if (hooks) hooks->before_backward(x.microbatch == M_ - 1 && x.pass != Pass::kB);
    model_.backward_units(a, scale, dout, part,
                          v == VS - 1 && x.pass != Pass::kW ? head_share(a) : nullptr);
    if (hooks) hooks->after_action();
    if (x.pass != Pass::kW && v > 0) send(kGradient, (v - 1) % P_, model_.input_grad(a), n, &a);
    note_peak();
    if (x.pass != Pass::kB)
      release(x.microbatch, x.chunk,
              i + 1 < list.size() && list[i + 1].pass == Pass::kF ? list[i + 1].chunk : -1);
  }
  wait_sends();
  if (hooks) hooks->step_ends();
  return loss;
}

ScheduleTiming PipelineStage::last_step_schedule() {
  size_t longest = 0;
  for (const StageActions& l : schedule_) longest = std::max(longest, l.size());
  std::vector<double> mine(longest, 0.0), all(longest * P_);
  std::copy(action_s_.begin(), action_s_.end(), mine.begin());
  pp_->allgather(mine.data(), all.data(), longest, DType::kF64);
  ActionCosts costs(P_);
  for (int p = 0; p < P_; ++p) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(p * longest);
    costs[p].assign(first, first + static_cast<std::ptrdiff_t>(schedule_[p].size()));
  }
  return simulate_schedule(schedule_, P_, V_, costs);
}

double PipelineStage::forward_only(const int* tokens, const int* targets, int B, int T,
                                   int microbatches, PipelineHooks* hooks, float* losses) {
  LOOM_CHECK(microbatches <= M_);
  double loss = 0;
  const int last_chunk = (P_ * V_ - 1) / P_;  // the chunk of the final virtual stage
  if (hooks) hooks->step_begins(false);
  for (int m = 0; m < microbatches; ++m) {
    for (int c = 0; c < V_; ++c) loss += forward_action(m, c, tokens, targets, B, T, hooks);
    if (losses && last())
      std::copy_n(model::Gpt::losses(*acts_[m][last_chunk]), static_cast<size_t>(B) * T,
                  losses + static_cast<size_t>(m) * B * T);
    for (int c = 0; c < V_; ++c) pool_[c].push_back(std::move(acts_[m][c]));
  }
  wait_sends();
  if (hooks) hooks->step_ends();
  return loss;
}

}  // namespace loom::parallel
