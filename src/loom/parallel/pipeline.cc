#include "loom/parallel/pipeline.h"

#include <algorithm>
#include <set>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::parallel {
using loom::DType;

PipelineStage::PipelineStage(model::Gpt& model, std::shared_ptr<comm::Communicator> pp,
                             std::vector<UnitRange> pieces, ScheduleKind kind, int microbatches)
    : model_(model), pp_(std::move(pp)), pieces_(std::move(pieces)), M_(microbatches) {
  P_ = pp_ ? pp_->size() : 1;
  stage_ = pp_ ? pp_->rank() : 0;
  LOOM_CHECK(!pieces_.empty() && pieces_.size() % P_ == 0);
  V_ = static_cast<int>(pieces_.size()) / P_;
  schedule_ = make_schedule(kind, P_, M_, V_);
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
  links_.resize(2 * P_ * P_);
  int index = 0;
  for (const auto& [kind_, from, to] : needed) {
    const bool member = stage_ == from || stage_ == to;
    auto c = pp_->split(member ? index : -1, stage_ == from ? 0 : 1);
    if (member) links_[(kind_ * P_ + from) * P_ + to].comm = std::move(c);
    ++index;
  }
  acts_.assign(M_, std::vector<model::Activations>(V_));
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
  l->comm->recv(l->staging.data(), n, DType::kF32, 0);
  return l->staging.data();
}

void PipelineStage::send(Kind kind, int to, const float* data, size_t n) {
  sends_.push_back(link(kind, stage_, to)->comm->send_async(data, n, DType::kF32, 1));
}

void PipelineStage::wait_sends() {
  for (auto& w : sends_) w->wait();
  sends_.clear();
}

// F(m, chunk): the input comes from the previous virtual stage (a receive, or this rank's
// previous chunk when there is one stage), the output goes to the next.
double PipelineStage::forward_action(int m, int chunk, const int* tokens, const int* targets, int B,
                                     int T) {
  const int v = chunk * P_ + stage_, VS = P_ * V_;
  const size_t n = static_cast<size_t>(model_.rows(B, T)) * model_.config().n_embd;
  model::Activations& a = acts_[m][chunk];
  const float* input = nullptr;
  if (v > 0)
    input = P_ == 1 ? model_.output(acts_[m][chunk - 1]) : receive(kActivation, (v - 1) % P_, n);
  const size_t off = static_cast<size_t>(m) * B * T;
  const double loss = model_.forward_units(a, pieces_[v].first, pieces_[v].last, tokens + off,
                                           targets ? targets + off : nullptr, B, T, input);
  if (v + 1 < VS && P_ > 1) send(kActivation, (v + 1) % P_, model_.output(a), n);
  return loss;
}

double PipelineStage::train_step(const int* tokens, const int* targets, int B, int T, float scale,
                                 PipelineHooks* hooks) {
  const int VS = P_ * V_;
  const size_t n = static_cast<size_t>(model_.rows(B, T)) * model_.config().n_embd;
  double loss = 0;
  for (const PipelineAction& x : schedule_[stage_]) {
    const int v = x.chunk * P_ + stage_;
    model::Activations& a = acts_[x.microbatch][x.chunk];
    if (x.pass == Pass::kF) {
      loss += forward_action(x.microbatch, x.chunk, tokens, targets, B, T);
      continue;
    }
    const float* dout = nullptr;
    if (x.pass != Pass::kW && v + 1 < VS)
      dout = P_ == 1 ? model_.input_grad(acts_[x.microbatch][x.chunk + 1])
                     : receive(kGradient, (v + 1) % P_, n);
    const model::BackwardPart part = x.pass == Pass::kBW  ? model::BackwardPart::kWhole
                                     : x.pass == Pass::kB ? model::BackwardPart::kInput
                                                          : model::BackwardPart::kWeight;
    // A unit's gradients are final after the last microbatch's BW or W.
    if (hooks) hooks->before_backward(x.microbatch == M_ - 1 && x.pass != Pass::kB);
    model_.backward_units(a, scale, dout, part);
    if (hooks) hooks->after_backward();
    if (x.pass != Pass::kW && v > 0 && P_ > 1)
      send(kGradient, (v - 1) % P_, model_.input_grad(a), n);
  }
  wait_sends();
  return loss;
}

double PipelineStage::forward_only(const int* tokens, const int* targets, int B, int T,
                                   int microbatches) {
  LOOM_CHECK(microbatches <= M_);
  double loss = 0;
  for (int m = 0; m < microbatches; ++m)
    for (int c = 0; c < V_; ++c) loss += forward_action(m, c, tokens, targets, B, T);
  wait_sends();
  return loss;
}

}  // namespace loom::parallel
