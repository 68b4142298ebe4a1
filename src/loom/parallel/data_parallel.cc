#include "loom/parallel/data_parallel.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "loom/core/check.h"
#include "loom/core/checksum.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/optim/grad_norm.h"

namespace loom::parallel {
using comm::ReduceOp;
using loom::DType;

namespace {

void to_bf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}
void from_bf16(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

// Moves a pooled buffer of size `n` into `out` (the first of that size: every rank of a
// machine that takes and gives in the same order gets the same one); false if none.
template <class V>
bool take_pooled(std::multimap<size_t, V>& pool, size_t n, V& out) {
  auto it = pool.find(n);
  if (it == pool.end()) return false;
  out = std::move(it->second);
  pool.erase(it);
  return true;
}

}  // namespace

DataParallel::DataParallel(model::Gpt& model, const ProcessGroups& groups, DpOptions o)
    : model_(model), dp_(groups.dp), tp_(groups.tp), opt_(std::move(o)) {
  policy_ = opt_.sharding ? opt_.sharding : make_sharding_policy(0);
  // zero.shard_group = node: the mesh's groups hold the machine's shard group and the
  // replica group across machines (parallel/process_groups.h).
  shard_group_ = policy_->shards() && groups.shard ? groups.shard : dp_;
  if (policy_->shards()) replica_group_ = groups.replica;
  S_ = shard_group_ ? shard_group_->size() : 1;
  r_ = shard_group_ ? shard_group_->rank() : 0;
  if (S_ == 1 && !replica_group_)  // nothing to shard: stages 2 and 3 are stage 1
    policy_ = make_sharding_policy(policy_->stage(), /*nothing_to_shard=*/true);

  size_t full = 0, shard = 0;
  const auto& held = opt_.units;
  for (int u = 0; u < model_.num_units(); ++u) {
    Unit x;
    std::tie(x.begin, x.end) = model_.unit_range(u);
    // A unit another pipeline stage holds is empty here: no buffers, no optimizer range.
    if (!held.empty() && std::find(held.begin(), held.end(), u) == held.end()) x.end = x.begin;
    x.shard = (x.n() + S_ - 1) / S_;
    x.own_begin = std::min(x.begin + r_ * x.shard, x.end);
    x.own_end = std::min(x.begin + (r_ + 1) * x.shard, x.end);
    x.full_off = full;
    x.shard_off = shard;
    full += x.shard * S_;
    shard += x.shard;
    units_.push_back(std::move(x));
  }
  const size_t nu = units_.size();
  shared_gather_ = policy_->params_sharded() && opt_.shared_gather && S_ > 1 &&
                   shard_group_->topology().max_local() > 1;
  if (opt_.shared_buffers && dp_ && !dp_->topology().force_tcp && dp_->topology().max_local() > 1)
    source_ = comm::shared_state_source();
  LOOM_CHECK_MSG(!opt_.offload_master || (opt_.moments && !policy_->shards()),
                 "zero.offload_master needs zero.offload = disk and ZeRO 0");
  {
    StateMemory::SourceScope from(source_);  // only these: the moments stay on the heap
    if (!opt_.offload_master) params_.assign(policy_->params_sharded() ? shard : full, 0.0f);
    grads_.assign(policy_->grads_whole_through_step() ? full : shard, 0.0f);
  }
  if (opt_.offload_master) {  // in flat-layout order: the units' buffers follow one another
    std::vector<SparseFloats::Range> absent;
    for (const model::Tensor& t : model_.tensors()) {
      const Unit& x = units_[t.unit];
      if (x.n() > 0 && offloaded(t))
        absent.push_back(
            {x.full_off + (t.offset - x.begin), x.full_off + (t.offset - x.begin) + t.size});
    }
    sparse_params_ = SparseFloats(full, absent);
  }
  std::vector<optim::DecaySpan> decay;
  for (const model::Tensor& t : model_.tensors())
    decay.push_back({t.offset, t.offset + t.size, t.decay});
  for (int u = 0; u < static_cast<int>(nu); ++u) {
    Unit& x = units_[u];
    optim::MomentFile* file = opt_.moments.get();
    x.adam = policy_->shards()
                 ? std::make_unique<optim::AdamW>(decay, x.own_begin, x.own_end, file)
                 : std::make_unique<optim::AdamW>(decay, x.begin, x.end, file, opt_.offload_master);
    x.adam->set_backend(&model_.backend());
    // Between uses the model sees the unit's parameters where they are replicated, and its
    // gradient buffer where a whole one lives through the step.
    float* params = policy_->params_sharded() ? nullptr : param_base() + x.full_off;
    float* grads = policy_->grads_whole_through_step() ? grads_.data() + x.full_off : nullptr;
    if (x.n() == 0) params = grads = nullptr;
    model_.bind_unit(u, params, grads);
  }
  model_.set_hooks(this);
  // ZeRO-3 gathers a unit for each use and frees it after: no bf16 copy of every unit.
  model_.set_bf16_weight_copies(!policy_->params_sharded());
  // zero.offload_master: this engine keeps the bf16 copies of the units with tensors whose
  // fp32 values leave memory (made before a step's thread writes into them).
  // The wte a first stage looks up from the file has no copy there: no product reads it.
  const bool head_here = !units_.empty() && units_.back().n() > 0;
  if (opt_.offload_master)
    for (const model::Tensor& t : model_.tensors())
      if (units_[t.unit].n() > 0 && offloaded(t) && (head_here || !looked_up_from_file(t)))
        model_.owner_bf16(t.unit);
  for (const model::Tensor& t : model_.tensors())
    if (units_[t.unit].n() > 0 && looked_up_from_file(t))
      model_.set_lookup_rows(
          [this, u = t.unit, at = t.offset - units_[t.unit].begin,
           C = static_cast<size_t>(t.shape.back())](const int* ids, size_t n, float* out) {
            for (size_t i = 0, j; i < n; i = j) {  // runs of consecutive ids: one read each
              for (j = i + 1; j < n && ids[j] == ids[j - 1] + 1;) ++j;
              read_master(u, at + static_cast<size_t>(ids[i]) * C, (j - i) * C, out + i * C);
            }
          });
}

DataParallel::~DataParallel() {
  model_.set_hooks(nullptr);
  model_.set_lookup_rows({});
  try {
    settle();
  } catch (const std::exception&) {  // reported where it was waited for, or moot now
  }
  // Let in-flight operations finish before their buffers go away.
  auto quietly_wait = [](const comm::WorkPtr& w) {
    try {
      if (w) w->wait();
    } catch (const std::exception&) {  // already reported by the step that failed
    }
  };
  for (auto& p : pending_) quietly_wait(p.work);
  for (auto& x : units_) quietly_wait(x.gathering);
  auto uncount = [](const comm::MachineBuffer& b) {
    if (b.size()) StateMemory::mine().sub(b.size() / b.sharers());
  };
  for (auto& x : units_) uncount(x.machine_gathered);
  for (auto& [n, b] : machine_pool_) uncount(b);
}

void DataParallel::wait(const comm::WorkPtr& w) {
  if (!w) return;
  if (w->test())
    w->wait();  // rethrows a failure
  else
    timed([&] { w->wait(); });
}

float* DataParallel::own_grad(int u) {
  const Unit& x = units_[u];
  switch (policy_->grads()) {
    case GradHome::kAllReduced:
      return grads_.data() + x.full_off;
    case GradHome::kReduceScatteredInPlace:
      return grads_.data() + x.full_off + r_ * x.shard;
    case GradHome::kReduceScatteredIntoShard:
      return grads_.data() + x.shard_off;
  }
  return nullptr;
}

float* DataParallel::own_param(int u) {
  const Unit& x = units_[u];
  if (!policy_->shards()) return param_base() + x.full_off;
  if (policy_->params_sharded()) return param_base() + x.shard_off;
  return param_base() + x.full_off + r_ * x.shard;
}

float* DataParallel::full_param(int u) {
  return param_base() + units_[u].full_off;
}

bool DataParallel::offloaded(const model::Tensor& t) const {
  return opt_.offload_master &&
         (model_.only_bf16_read(t, /*lookup=*/!opt_.unit0_is_head_copy) || looked_up_from_file(t));
}

bool DataParallel::looked_up_from_file(const model::Tensor& t) const {
  return opt_.offload_master && opt_.lookup_from_master && !opt_.unit0_is_head_copy &&
         t.name == "wte";
}

void DataParallel::master_changed(int u, size_t lo, size_t n, const float* v) {
  const Unit& x = units_[u];
  if (model_.bf16_owned(u))
    model_.backend().round_to_bf16(model_.owner_bf16(u) + lo, v, static_cast<int64_t>(n));
  for (const auto& [a, b] : sparse_params_.resident(x.full_off + lo, x.full_off + lo + n))
    std::copy(v + (a - x.full_off - lo), v + (b - x.full_off - lo), param_base() + a);
}

void DataParallel::read_master(int u, size_t lo, size_t n, float* out) const {
  const Unit& x = units_[u];
  x.adam->read(optim::AdamW::kMaster, x.begin + lo - x.adam->begin(), n, out);
}

template <typename Fn>
void DataParallel::in_pieces(size_t n, Fn fn) const {
  const size_t step = opt_.moments ? opt_.moments->chunk() : optim::MomentFile::kChunk;
  for (size_t lo = 0; lo < n; lo += step) fn(lo, std::min(step, n - lo));
}

template <typename Fn>
void DataParallel::for_each_piece(int u, Fn fn) const {
  in_pieces(units_[u].n(), fn);
}

// A tensor split across the model-parallel group counts on every rank (each holds its own
// part); a replicated one on the group's first rank only.
// The tied embedding's copy on the last pipeline stage counts on the first stage only.
bool DataParallel::counted_here(const model::Tensor& t) const {
  if (opt_.unit0_is_head_copy && t.unit == 0) return false;
  return !t.replicated || !tp_ || tp_->rank() == 0;
}

template <typename Fn>
void DataParallel::for_each_slice(int u, size_t lo, size_t hi, Fn fn) const {
  for (const model::Tensor& t : model_.tensors()) {
    if (t.unit != u) continue;
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.size);
    if (a < b) fn(t, static_cast<int64_t>(a - t.offset), static_cast<int64_t>(b - a), a);
  }
}

StateVector DataParallel::take(size_t n) {
  StateVector v;
  if (take_pooled(pool_, n, v)) return v;
  StateMemory::SourceScope from(source_);
  return StateVector(n);
}

void DataParallel::give(StateVector& v) {
  pool_.emplace(v.size(), std::move(v));
  v = StateVector();
}

// ---- weights ----

void DataParallel::init_weights(uint64_t seed) {
  settle();
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    release_gathered(u);
    const Unit& x = units_[u];
    if (policy_->params_sharded()) {
      std::fill(own_param(u), own_param(u) + x.shard, 0.0f);  // padding stays 0
      model_.init_params(seed, x.own_begin, x.own_end, own_param(u));
    } else if (opt_.offload_master) {
      std::vector<float> v;
      for_each_piece(u, [&](size_t lo, size_t n) {
        v.resize(n);
        model_.init_params(seed, x.begin + lo, x.begin + lo + n, v.data());
        x.adam->write(optim::AdamW::kMaster, lo, n, v.data());
        master_changed(u, lo, n, v.data());
      });
    } else {
      model_.init_params(seed, x.begin, x.end, full_param(u));
    }
  }
}

std::optional<uint64_t> DataParallel::replica_checksum() const {
  settle();
  if (policy_->params_sharded()) return std::nullopt;
  if (!opt_.offload_master) return checksum64(params_.data(), params_.size() * sizeof(float));
  Checksum64 sum;  // the master weights, unit by unit, streamed from the file
  std::vector<float> v;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    for_each_piece(u, [&](size_t lo, size_t n) {
      v.resize(n);
      read_master(u, lo, n, v.data());
      sum.update(v.data(), n * sizeof(float));
    });
  return sum.value();
}

uint64_t DataParallel::held_checksum(const std::function<bool(const model::Tensor&)>& keep) {
  settle();
  Checksum64 sum;
  const bool sharded = policy_->params_sharded();
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    const Unit& x = units_[u];
    for_each_slice(u, sharded ? x.own_begin : x.begin, sharded ? x.own_end : x.end,
                   [&](const model::Tensor& t, int64_t, int64_t n, size_t a) {
                     if (!keep(t)) return;
                     if (offloaded(t)) {  // not in memory: from the file, a piece at a time
                       std::vector<float> v;
                       in_pieces(static_cast<size_t>(n), [&](size_t o, size_t len) {
                         v.resize(len);
                         read_master(u, a - x.begin + o, len, v.data());
                         sum.update(v.data(), len * sizeof(float));
                       });
                       return;
                     }
                     const float* p =
                         sharded ? own_param(u) + (a - x.own_begin) : full_param(u) + (a - x.begin);
                     sum.update(p, static_cast<size_t>(n) * sizeof(float));
                   });
  }
  return sum.value();
}

// A tensor's slice [b, b + n) in this rank's part of it, as a checkpoint region.
static ckpt::Region region_of(const model::Tensor& t, int64_t b, int64_t n) {
  return {t.start, t.extent, b, n};
}

void DataParallel::load(const ckpt::TensorSource& r, bool weights_only) {
  settle();
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    release_gathered(u);
    const Unit& x = units_[u];
    optim::AdamW& adam = *x.adam;
    const size_t mbase = adam.begin();  // the moments cover the optimizer's range
    std::vector<float> tmp;
    // Reads `name + t.name`'s slice [b, b + n) a piece at a time and hands each piece to
    // `use(o, len, values)`: the tensors that live in the file need not fit in memory at once.
    auto read_in_pieces = [&](const std::string& name, const model::Tensor& t, int64_t b, int64_t n,
                              const auto& use) {
      in_pieces(static_cast<size_t>(n), [&](size_t o, size_t len) {
        tmp.resize(len);
        r.read(name + t.name, t.shape,
               region_of(t, b + static_cast<int64_t>(o), static_cast<int64_t>(len)), tmp.data());
        use(o, len, tmp.data());
      });
    };
    for_each_slice(
        u, mbase, adam.end(), [&](const model::Tensor& t, int64_t b, int64_t n, size_t a) {
          for (const auto& moment :
               {std::pair{"adam_m/", optim::AdamW::kM}, std::pair{"adam_v/", optim::AdamW::kV}}) {
            if (weights_only) break;
            const auto which = moment.second;  // named: clang 14 cannot capture a binding
            read_in_pieces(moment.first, t, b, n, [&](size_t o, size_t len, const float* v) {
              adam.write(which, a - mbase + o, len, v);
            });
          }
          if (policy_->params_sharded())
            r.read("param/" + t.name, t.shape, region_of(t, b, n),
                   own_param(u) + (a - x.own_begin));
        });
    if (opt_.offload_master)  // into the file, and from there the copies in memory
      for_each_slice(u, x.begin, x.end,
                     [&](const model::Tensor& t, int64_t b, int64_t n, size_t a) {
                       read_in_pieces("param/", t, b, n, [&](size_t o, size_t len, const float* v) {
                         adam.write(optim::AdamW::kMaster, a - mbase + o, len, v);
                         master_changed(u, a - x.begin + o, len, v);
                       });
                     });
    else if (!policy_->params_sharded())
      for_each_slice(
          u, x.begin, x.end, [&](const model::Tensor& t, int64_t b, int64_t n, size_t a) {
            r.read("param/" + t.name, t.shape, region_of(t, b, n), full_param(u) + (a - x.begin));
          });
  }
}

std::vector<ckpt::Piece> DataParallel::checkpoint_pieces() {
  settle();
  std::vector<ckpt::Piece> pieces;
  if (replica_group_ && replica_group_->rank() != 0) return pieces;  // a replica writes
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    const Unit& x = units_[u];
    const optim::AdamW* adam = x.adam.get();
    const size_t mbase = adam->begin();
    for_each_slice(
        u, x.own_begin, x.own_end, [&](const model::Tensor& t, int64_t b, int64_t n, size_t a) {
          if (!counted_here(t)) return;
          const float* p = policy_->params_sharded() ? own_param(u) + (a - x.own_begin)
                                                     : full_param(u) + (a - x.begin);
          const ckpt::Region reg = region_of(t, b, n);
          if (offloaded(t)) {  // streamed from the file
            const size_t off = a - mbase;
            pieces.push_back({"param/" + t.name, t.shape, reg, nullptr,
                              [adam, off](int64_t begin, int64_t count, float* out) {
                                adam->read(optim::AdamW::kMaster, off + static_cast<size_t>(begin),
                                           static_cast<size_t>(count), out);
                              }});
          } else {
            pieces.push_back({"param/" + t.name, t.shape, reg, p, {}});
          }
          for (const auto& moment :
               {std::pair{"adam_m/", optim::AdamW::kM}, std::pair{"adam_v/", optim::AdamW::kV}}) {
            // Named variables: the lambda below captures `which`, and clang 14 cannot
            // capture a structured binding.
            const std::string name = moment.first;
            const auto which = moment.second;
            const float* mem = adam->in_memory(which);  // else streamed from the file
            const size_t off = a - mbase;
            pieces.push_back({name + t.name, t.shape, reg, mem ? mem + off : nullptr,
                              [adam, which, off](int64_t begin, int64_t count, float* out) {
                                adam->read(which, off + static_cast<size_t>(begin),
                                           static_cast<size_t>(count), out);
                              }});
          }
        });
  }
  return pieces;
}

// ---- one step ----

void DataParallel::zero_grad() {
  if (overlapped_.thread.joinable()) {
    grads_stale_.assign(units_.size(), 1);  // the update still reads them: zeroed at each
    return;                                 // unit's first use (await_unit)
  }
  grads_stale_.clear();
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

float DataParallel::forward(const int* tokens, const int* targets, int B, int T) {
  phase_ = Phase::kForward;
  cursor_ = 0;
  const float loss = model_.forward(tokens, targets, B, T);
  recorded_[0] = true;
  phase_ = Phase::kIdle;
  return loss;
}

void DataParallel::backward(float scale, bool last_micro_step) {
  retire_done(0);  // the previous micro-step's reductions own their units' gradient buffers
  phase_ = Phase::kBackward;
  cursor_ = 0;
  last_micro_ = last_micro_step;
  model_.backward(scale);
  recorded_[1] = true;
  phase_ = Phase::kIdle;
}

void DataParallel::launch_reduction(int u) {
  Unit& x = units_[u];
  Pending p{u, nullptr, {}};
  if (policy_->grads() == GradHome::kAllReduced) {
    float* g = grads_.data() + x.full_off;
    if (opt_.comm_bf16) {
      p.bf16.resize(x.n());
      to_bf16(g, p.bf16.data(), x.n());
      p.work =
          dp_->allreduce_async(p.bf16.data(), p.bf16.data(), x.n(), DType::kBF16, ReduceOp::kAvg);
    } else {
      p.work = dp_->allreduce_async(g, g, x.n(), DType::kF32, ReduceOp::kAvg);
    }
  } else if (S_ > 1) {
    float* g =
        policy_->grads_whole_through_step() ? grads_.data() + x.full_off : x.full_grad.data();
    const size_t full = x.shard * S_;
    if (opt_.comm_bf16) {
      p.bf16.resize(full);
      to_bf16(g, p.bf16.data(), full);
      p.work = shard_group_->reduce_scatter_async(p.bf16.data(), p.bf16.data() + r_ * x.shard,
                                                  x.shard, DType::kBF16, ReduceOp::kAvg);
    } else {
      p.work = shard_group_->reduce_scatter_async(g, g + r_ * x.shard, x.shard, DType::kF32,
                                                  ReduceOp::kAvg);
    }
  }
  pending_.push_back(std::move(p));
}

void DataParallel::retire(Pending& p) {
  wait(p.work);
  const int u = p.unit;
  Unit& x = units_[u];
  if (policy_->grads() == GradHome::kAllReduced) {
    if (!p.bf16.empty()) from_bf16(p.bf16.data(), grads_.data() + x.full_off, x.n());
    return;
  }
  // This rank's reduced slice, as fp32.
  float* slice = policy_->grads_whole_through_step() ? grads_.data() + x.full_off + r_ * x.shard
                                                     : x.full_grad.data() + r_ * x.shard;
  if (!p.bf16.empty()) from_bf16(p.bf16.data() + r_ * x.shard, slice, x.shard);
  if (!policy_->grads_whole_through_step()) {  // into the persistent shard; drop the full one
    float* dst = grads_.data() + x.shard_off;
    for (size_t i = 0; i < x.shard; ++i) dst[i] += slice[i];
    give(x.full_grad);
    model_.bind_unit(u, policy_->params_sharded() ? nullptr : full_param(u), nullptr);
  }
}

void DataParallel::retire_done(size_t max_in_flight) {
  while (!pending_.empty() && (!pending_.front().work || pending_.front().work->test() ||
                               pending_.size() > max_in_flight)) {
    retire(pending_.front());
    pending_.pop_front();
  }
}

void DataParallel::finish_reductions() {
  retire_done(0);
  if (replica_group_ && policy_->shards()) {
    // Across machines, once per step, after every micro-step has been reduced inside the
    // machine. (Here and not as each reduce-scatter lands: that moment differs between
    // ranks, and blocking on a second group at rank-dependent points can deadlock.)
    std::vector<comm::WorkPtr> works;
    for (int u = 0; u < static_cast<int>(units_.size()); ++u)
      works.push_back(replica_group_->allreduce_async(own_grad(u), own_grad(u), units_[u].shard,
                                                      DType::kF32, ReduceOp::kAvg));
    for (auto& w : works) wait(w);
  }
}

float* DataParallel::unit_grad(int u) {
  return own_grad(u);
}

size_t DataParallel::unit_grad_size(int u) const {
  return units_[u].adam->end() - units_[u].adam->begin();
}

double DataParallel::grad_sum_of_squares() {
  // Stage 0: every rank holds the whole averaged gradient; 1-3: each its slices, summed
  // over the shard group. Replicated tensors count on one tensor-parallel rank, the tied
  // embedding's head copy not at all.
  await_units();
  double ss = 0;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    const size_t base = units_[u].adam->begin();
    for_each_slice(u, base, units_[u].adam->end(),
                   [&](const model::Tensor& t, int64_t, int64_t n, size_t a) {
                     if (counted_here(t)) ss += optim::sum_of_squares(own_grad(u) + (a - base), n);
                   });
  }
  if (policy_->shards() && S_ > 1)
    timed([&] { shard_group_->allreduce(&ss, &ss, 1, DType::kF64, ReduceOp::kSum); });
  return ss;
}

std::optional<std::pair<int, std::string>> DataParallel::first_nonfinite_grad() {
  await_units();
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    const size_t base = units_[u].adam->begin();
    std::optional<std::pair<int, std::string>> found;
    for_each_slice(u, base, units_[u].adam->end(),
                   [&](const model::Tensor& t, int64_t, int64_t n, size_t a) {
                     const float* g = own_grad(u) + (a - base);
                     if (!found && !std::all_of(g, g + n, [](float x) { return std::isfinite(x); }))
                       found = {{u, t.name}};
                   });
    if (found) return found;
  }
  return std::nullopt;
}

bool DataParallel::overlaps_step() const {
  return opt_.overlap_step && opt_.moments && !policy_->shards();
}

void DataParallel::optimizer_step(float grad_scale, double lr, const optim::AdamWParams& c,
                                  int64_t t) {
  const int nu = static_cast<int>(units_.size());
  await_units();
  settle();
  for (int u = 0; u < nu; ++u) release_gathered(u);  // stage 3: gathered copies go stale
  std::vector<optim::AdamW::RangeStep> ranges;
  std::vector<int> unit_of;  // ranges[i] steps unit unit_of[i]
  for (int u = 0; u < nu; ++u) {
    optim::AdamW& adam = *units_[u].adam;
    if (adam.end() > adam.begin())
      ranges.push_back({&adam, opt_.offload_master ? nullptr : own_param(u), own_grad(u)}),
          unit_of.push_back(u);
  }
  // zero.offload_master: each updated chunk of the master makes its part of the copies the
  // model reads (the range is the whole unit: ZeRO 0).
  optim::AdamW::Fresh fresh;
  if (opt_.offload_master)
    fresh = [this, unit_of](size_t i, size_t lo, size_t hi, const float* v) {
      master_changed(unit_of[i], lo, hi - lo, v);
    };
  if (overlaps_step()) {
    Overlapped& o = overlapped_;
    o.updated.assign(units_.size(), 1);
    for (int u : unit_of) o.updated[u] = 0;
    o.error = nullptr;
    o.thread = std::thread([&o, ranges, unit_of, fresh, grad_scale, lr, c, t] {
      omp_set_num_threads(1);  // beside the compute threads, waiting on the file mostly
      auto mark = [&o](int u) {
        {
          std::lock_guard<std::mutex> lock(o.mu);
          if (u >= 0)
            o.updated[u] = 1;
          else
            std::fill(o.updated.begin(), o.updated.end(), 1);
        }
        o.cv.notify_all();
      };
      try {
        optim::AdamW::step_all(
            ranges, grad_scale, lr, c, t, [&](size_t i) { mark(unit_of[i]); }, fresh);
      } catch (...) {
        std::lock_guard<std::mutex> lock(o.mu);
        o.error = std::current_exception();
      }
      mark(-1);  // done, or failed: nobody waits on
    });
    return;
  }
  optim::AdamW::step_all(ranges, grad_scale, lr, c, t, {}, fresh);  // offloaded: one stream
  if (policy_->gathers_after_step() && S_ > 1) {
    std::vector<comm::WorkPtr> works;
    for (int u = 0; u < nu; ++u) {
      const Unit& x = units_[u];
      works.push_back(
          shard_group_->allgather_async(own_param(u), full_param(u), x.shard, DType::kF32));
    }
    for (auto& w : works) wait(w);
  }
}

void DataParallel::await_unit(int u) {
  Overlapped& o = overlapped_;
  if (o.thread.joinable()) {
    std::unique_lock<std::mutex> lock(o.mu);
    if (!o.updated[u]) {
      step_wait_s_ += seconds_taken([&] { o.cv.wait(lock, [&] { return o.updated[u] != 0; }); });
    }
    if (o.error) {
      lock.unlock();
      settle();  // joins and rethrows
    }
  }
  if (!grads_stale_.empty() && grads_stale_[u]) {
    const Unit& x = units_[u];
    std::fill(grads_.begin() + static_cast<std::ptrdiff_t>(x.full_off),
              grads_.begin() + static_cast<std::ptrdiff_t>(x.full_off + x.shard * S_), 0.0f);
    grads_stale_[u] = 0;
  }
}

void DataParallel::await_units() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) await_unit(u);
}

void DataParallel::settle() const {
  Overlapped& o = overlapped_;
  if (!o.thread.joinable()) return;
  step_wait_s_ += seconds_taken([&] { o.thread.join(); });
  if (o.error) std::rethrow_exception(std::exchange(o.error, nullptr));
}

// ---- hooks ----

void DataParallel::before_forward() {
  phase_ = Phase::kForward;
}

void DataParallel::before_backward(bool last_microbatch) {
  phase_ = Phase::kBackward;
  last_micro_ = last_microbatch;
}

void DataParallel::after_action() {
  phase_ = Phase::kIdle;
}

void DataParallel::step_begins(bool training) {
  pipeline_step_ = training ? 1 : 0;
  cursor_ = 0;
}

void DataParallel::step_ends() {
  if (pipeline_step_ >= 0) recorded_[pipeline_step_] = true;
  pipeline_step_ = -1;
}

int DataParallel::use_order() const {
  if (opt_.pipeline) return pipeline_step_;
  return phase_ == Phase::kBackward ? 1 : 0;
}

int DataParallel::next_use(int u) {
  const int ph = use_order();
  if (phase_ == Phase::kIdle || ph < 0) return -1;
  auto& order = order_[ph];
  if (!recorded_[ph]) {
    order.push_back(u);
    return -1;
  }
  if (cursor_ < order.size() && order[cursor_] == u) {
    ++cursor_;
  } else {  // out of the recorded order: find u's next occurrence
    auto it =
        std::find(order.begin() + static_cast<std::ptrdiff_t>(std::min(cursor_, order.size())),
                  order.end(), u);
    if (it == order.end()) return -1;
    cursor_ = static_cast<size_t>(it - order.begin()) + 1;
  }
  return cursor_ < order.size() ? order[cursor_] : -1;
}

void DataParallel::gather(int u) {
  Unit& x = units_[u];
  if (shared_gather_) {
    if (x.machine_gathered.size() > 0 || x.shard == 0) return;
    const size_t bytes = x.shard * S_ * sizeof(float);
    if (!take_pooled(machine_pool_, bytes, x.machine_gathered)) {
      // collective over the shard group: every rank's pool is empty here too
      x.machine_gathered = shard_group_->alloc_machine_buffer(bytes);
      StateMemory::mine().add(bytes / x.machine_gathered.sharers());
    }
    x.gathering = shard_group_->allgather_shared_async(own_param(u), x.machine_gathered, x.shard,
                                                       DType::kF32);
    return;
  }
  if (!x.gathered.empty()) return;
  x.gathered = take(x.shard * S_);
  x.gathering =
      shard_group_->allgather_async(own_param(u), x.gathered.data(), x.shard, DType::kF32);
}

float* DataParallel::gathered(int u) {
  Unit& x = units_[u];
  return shared_gather_ ? x.machine_gathered.as<float>() : x.gathered.data();
}

void DataParallel::release_gathered(int u) {
  Unit& x = units_[u];
  if (x.gathering) wait(x.gathering), x.gathering = nullptr;
  if (!x.gathered.empty()) give(x.gathered);
  if (x.machine_gathered.size() > 0) {
    const size_t bytes = x.machine_gathered.size();
    machine_pool_.emplace(bytes, std::move(x.machine_gathered));
  }
}

void DataParallel::before_use(int u) {
  await_unit(u);  // the overlapped step's update of u (and its stale gradients)
  if (policy_->grads_whole_through_step() || phase_ == Phase::kIdle) return;
  Unit& x = units_[u];
  const bool backward = phase_ == Phase::kBackward;
  if (backward) {
    retire_done(2);  // frees the full gradients of units already reduced
    if (x.full_grad.empty()) {
      x.full_grad = take(x.shard * S_);
      std::fill(x.full_grad.begin(), x.full_grad.end(), 0.0f);
    }
  }
  float* g = x.full_grad.empty() ? nullptr : x.full_grad.data();
  if (!policy_->params_sharded()) {
    model_.bind_unit(u, full_param(u), g);
    return;
  }
  const bool ahead = x.gathering || x.gathered.size() > 0 || x.machine_gathered.size() > 0;
  if (!ahead) ++gathers_on_use_;
  gather(u);
  if (x.gathering) wait(x.gathering), x.gathering = nullptr;
  model_.bind_unit(u, gathered(u), g);
  const int next = next_use(u);
  for (int v = 0; v < static_cast<int>(units_.size()); ++v)
    if (v != u && v != next) release_gathered(v);
  if (next >= 0) gather(next);  // prefetch: overlaps this unit's compute
}

void DataParallel::after_use(int u) {
  if (!policy_->params_sharded() || phase_ == Phase::kIdle) return;
  const int ph = use_order();
  if (opt_.pipeline) {  // a step's order spans its actions: keep u only for a use next
    const bool next_is_u =
        ph >= 0 && recorded_[ph] && cursor_ < order_[ph].size() && order_[ph][cursor_] == u;
    if (!next_is_u) release_gathered(u);
    return;
  }
  const auto& order = order_[ph];
  if (!recorded_[ph]) return;           // first step: freed at the next use of another unit
  if (cursor_ >= order.size()) return;  // the phase's last use: the next phase starts with it
  if (order[cursor_] != u) release_gathered(u);
}

void DataParallel::grads_ready(int u) {
  const bool per_use = !policy_->grads_whole_through_step();  // a buffer per use
  if (!per_use || opt_.pipeline) {                            // once per step
    if (last_micro_ && (per_use || dp_)) launch_reduction(u);
    if (per_use) retire_done(2);
    return;
  }
  launch_reduction(u);
  retire_done(2);
}

}  // namespace loom::parallel
