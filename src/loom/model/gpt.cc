#include "loom/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "loom/core/check.h"
#include "loom/core/checksum.h"
#include "loom/core/error.h"
#include "loom/core/random.h"
#include "loom/model/vocab_parallel_loss.h"

namespace loom::model {

GptConfig GptConfig::named(const std::string& name) {
  GptConfig c;
  c.name = name;
  if (name == "tiny")
    c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.block_size = 64;
  else if (name == "small")
    c.n_layer = 6, c.n_head = 6, c.n_embd = 384, c.block_size = 256;
  else if (name == "gpt2-124m")
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.block_size = 1024;
  else if (name == "gpt2-350m")
    c.n_layer = 24, c.n_head = 16, c.n_embd = 1024, c.block_size = 1024;
  else if (name == "gpt2-774m")
    c.n_layer = 36, c.n_head = 20, c.n_embd = 1280, c.block_size = 1024;
  else if (name == "gpt2-1558m")
    c.n_layer = 48, c.n_head = 25, c.n_embd = 1600, c.block_size = 1024;
  else
    throw UserError("model.name '" + name + "' is not a named config",
                    "use tiny, small, gpt2-124m, gpt2-350m, gpt2-774m or gpt2-1558m");
  return c;
}

GptConfig GptConfig::reshaped(int layers, int hidden, int heads, int vocab, int context) const {
  GptConfig g = *this;
  if (layers > 0) g.n_layer = layers;
  if (hidden > 0) g.n_embd = hidden;
  if (heads > 0) g.n_head = heads;
  if (vocab > 0) g.vocab_size = vocab, g.padded_vocab_size = (vocab + 127) / 128 * 128;
  if (context > 0) g.block_size = context;
  if (layers > 0 || hidden > 0 || heads > 0 || vocab > 0 || context > 0)
    g.name = "custom " + std::to_string(g.n_layer) + "x" + std::to_string(g.n_embd);
  return g;
}

void GptConfig::validate() const {
  auto bad = [](const std::string& key, int v, const std::string& want) {
    return UserError("model." + key + " = " + std::to_string(v) + " is invalid: " + want,
                     "fix the model section of the config");
  };
  if (n_layer < 1) throw bad("n_layer", n_layer, "needs at least 1");
  if (n_head < 1) throw bad("n_head", n_head, "needs at least 1");
  if (n_embd < 1 || n_embd % n_head)
    throw bad("n_embd", n_embd, "must be a positive multiple of n_head");
  if (block_size < 1) throw bad("block_size", block_size, "needs at least 1");
  if (vocab_size < 1 || vocab_size > 65536)
    throw bad("vocab_size", vocab_size, "must be 1..65536 (uint16 tokens)");
  if (padded_vocab_size < vocab_size)
    throw bad("padded_vocab_size", padded_vocab_size, "must be >= vocab_size");
}

nlohmann::json GptConfig::to_json() const {
  return {{"name", name},
          {"n_layer", n_layer},
          {"n_head", n_head},
          {"n_embd", n_embd},
          {"block_size", block_size},
          {"vocab_size", vocab_size},
          {"padded_vocab_size", padded_vocab_size}};
}

GptConfig GptConfig::from_json(const nlohmann::json& j) {
  GptConfig c;
  try {
    c.name = j.at("name");
    c.n_layer = j.at("n_layer"), c.n_head = j.at("n_head"), c.n_embd = j.at("n_embd");
    c.block_size = j.at("block_size"), c.vocab_size = j.at("vocab_size");
    c.padded_vocab_size = j.at("padded_vocab_size");
  } catch (const nlohmann::json::exception& e) {
    throw UserError(std::string("model description is incomplete: ") + e.what(),
                    "the checkpoint was not written by this version of loom");
  }
  c.validate();
  return c;
}

void GptConfig::validate_split(int t) const {
  if (t < 1) throw UserError("train.tp = " + std::to_string(t) + " is invalid", "use 1 or more");
  if (n_head % t != 0)
    throw UserError("train.tp = " + std::to_string(t) + " does not divide the " +
                        std::to_string(n_head) + " attention heads of " + name,
                    "pick a tensor-parallel size that divides the head count");
  if (padded_vocab_size % t != 0)
    throw UserError("train.tp = " + std::to_string(t) + " does not divide the padded vocabulary (" +
                        std::to_string(padded_vocab_size) + ") of " + name,
                    "pick a tensor-parallel size that divides it");
}

double GptConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer;
  const double matrix_params = vocab_size * C + L * (12 * C * C + 13 * C) + 2 * C;
  return 6 * matrix_params + 12 * L * C * T;
}

Gpt::Gpt(GptConfig cfg, bool own_storage, TensorSplit split, bool with_grads)
    : cfg_(std::move(cfg)), split_(split), backend_(kernels::make_backend("cpu")) {
  cfg_.validate();
  cfg_.validate_split(split_.size);
  LOOM_CHECK(split_.rank >= 0 && split_.rank < split_.size);
  tp_ = split_.size;
  sp_ = split_.sequence_parallel && tp_ > 1;
  const int64_t C = cfg_.n_embd, L = cfg_.n_layer, Vp = cfg_.padded_vocab_size, t = tp_;
  Cl_ = static_cast<int>(C / t), NHl_ = cfg_.n_head / tp_, Vl_ = static_cast<int>(Vp / t);
  vocab_begin_ = split_.rank * Vl_;
  vocab_valid_ = std::clamp(cfg_.vocab_size - vocab_begin_, 0, Vl_);
  size_t at = 0;
  // A tensor of the whole shape `shape`, split along `dim` (-1: replicated) into t parts.
  auto add = [&](const std::string& name, Shape shape, int dim, int unit, bool decay) {
    Shape start(shape.size(), 0), extent = shape;
    if (dim >= 0) {
      extent[dim] = shape[dim] / t;
      start[dim] = split_.rank * extent[dim];
    }
    const size_t n = static_cast<size_t>(numel(extent));
    tensors_.push_back(
        {name, std::move(shape), std::move(start), std::move(extent), at, n, unit, decay, dim < 0});
    at += n;
  };
  units_.push_back({at, 0});
  add("wte", {Vp, C}, 0, 0, true);
  add("wpe", {cfg_.block_size, C}, -1, 0, true);
  units_[0].second = at;
  const Shape shapes[kBlockTensors] = {{C}, {C}, {3, C, C},  {3, C},  {C, C},     {C},
                                       {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
  const int split_dim[kBlockTensors] = {-1, -1, 1, 1, 1, -1, -1, -1, 0, 0, 1, -1};
  const char* names[kBlockTensors] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                      "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
  const bool decay[kBlockTensors] = {false, false, true, false, true, false,
                                     false, false, true, false, true, false};
  for (int64_t l = 0; l < L; ++l) {
    units_.push_back({at, 0});
    for (int i = 0; i < kBlockTensors; ++i) {
      if (l == 0) block_offsets_.push_back(at - units_.back().first);
      add("h" + std::to_string(l) + "." + names[i], shapes[i], split_dim[i],
          static_cast<int>(l) + 1, decay[i]);
    }
    units_.back().second = at;
  }
  units_.push_back({at, 0});
  add("lnfw", {C}, -1, static_cast<int>(L) + 1, false);
  add("lnfb", {C}, -1, static_cast<int>(L) + 1, false);
  units_.back().second = at;
  total_ = at;
  unit_params_.assign(units_.size(), nullptr);
  unit_grads_.assign(units_.size(), nullptr);
  if (own_storage) {
    params_.assign(at, 0.0f);
    if (with_grads) grads_.assign(at, 0.0f);
    for (int u = 0; u < num_units(); ++u)
      bind_unit(u, params_.data() + units_[u].first,
                with_grads ? grads_.data() + units_[u].first : nullptr);
  }
}

const float* Gpt::param(const std::string& name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return unit_params_[t.unit] + (t.offset - units_[t.unit].first);
  throw InternalError("no parameter tensor " + name);
}

void Gpt::bind_unit(int u, float* params, float* grads) {
  unit_params_[u] = params;
  unit_grads_[u] = grads;
}

void Gpt::set_lookup_rows(RowSource rows) {
  LOOM_CHECK_MSG(!rows || tp_ == 1, "the lookup's rows are fetched without tensor parallelism");
  lookup_rows_ = std::move(rows);
}

void Gpt::set_backend(std::unique_ptr<kernels::Backend> b) {
  b->set_precision(backend_->precision());
  backend_ = std::move(b);
  // Copies the model made were for the old backend's products; the owner's stay.
  for (size_t u = 0; u < unit16_.size(); ++u)
    if (!bf16_owned(static_cast<int>(u))) unit16_[u] = Copy16(), unit16_from_[u] = nullptr;
}

void Gpt::make_copy_slots() {
  if (unit16_.empty()) unit16_.resize(units_.size()), unit16_from_.assign(units_.size(), nullptr);
}

uint16_t* Gpt::owner_bf16(int u) {
  make_copy_slots();
  if (owned16_.empty()) owned16_.assign(units_.size(), 0);
  const auto [begin, end] = units_[u];
  if (!owned16_[u]) unit16_[u].assign(end - begin, 0), owned16_[u] = 1;
  return unit16_[u].data();
}

bool Gpt::only_bf16_read(const Tensor& t, bool lookup) const {
  if (t.unit == 0) return !lookup;
  if (t.unit > cfg_.n_layer) return false;
  const size_t at = t.offset - units_[t.unit].first;
  for (BlockTensor m : {kQkvw, kProjw, kFcw, kFcProjw})
    if (at == block_offsets_[m]) return true;
  return false;
}

void Gpt::round_unit(int u) {
  if (bf16_owned(u)) return;  // the owner's copy is current
  if (!bf16_copies_ || !backend_->reads_bf16() || !unit_params_[u]) return;
  make_copy_slots();
  const auto [begin, end] = units_[u];
  unit16_[u].resize(end - begin);
  backend_->round_to_bf16(unit16_[u].data(), unit_params_[u], static_cast<int64_t>(end - begin));
  unit16_from_[u] = unit_params_[u];
}

const uint16_t* Gpt::p16(int unit, size_t offset) const {
  if (bf16_owned(unit)) return unit16_[unit].data() + offset;
  if (unit16_.empty() || !unit16_from_[unit] || unit16_from_[unit] != unit_params_[unit] ||
      !backend_->reads_bf16())
    return nullptr;
  return unit16_[unit].data() + offset;
}

void Gpt::init(uint64_t seed) {
  LOOM_CHECK(!params_.empty());
  init_params(seed, 0, total_, params_.data());
}

void Gpt::init_params(uint64_t seed, size_t begin, size_t end, float* out) const {
  const float std_proj = 0.02f / std::sqrt(2.0f * cfg_.n_layer);
  const int64_t real_wte = static_cast<int64_t>(cfg_.vocab_size) * cfg_.n_embd;
  for (const Tensor& t : tensors_) {
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.size);
    if (lo >= hi) continue;
    float* x = out + (lo - begin);
    const bool is_ln_w = t.name.ends_with("ln1w") || t.name.ends_with("ln2w") || t.name == "lnfw";
    if (is_ln_w || !t.decay) {
      std::fill(x, x + (hi - lo), is_ln_w ? 1.0f : 0.0f);
      continue;
    }
    const float sd =
        (t.name.ends_with("attprojw") || t.name.ends_with("fcprojw")) ? std_proj : 0.02f;
    const uint64_t key = mix64(seed ^ mix64(fnv1a64(t.name)));
    // Padded vocabulary rows never receive gradient; they stay zero.
    const int64_t limit = t.name == "wte" ? real_wte : numel(t.shape);
    for_each_box_run(
        t.shape, t.start, t.extent, static_cast<int64_t>(lo - t.offset),
        static_cast<int64_t>(hi - lo), [&](int64_t pos, int64_t flat, int64_t len) {
          float* o = x + (pos - static_cast<int64_t>(lo - t.offset));
#pragma omp parallel for if (len > 65536)
          for (int64_t i = 0; i < len; ++i)
            o[i] = flat + i < limit ? sd * normal_at(key, static_cast<uint64_t>(flat + i)) : 0.0f;
        });
  }
}

void Gpt::zero_grad() {
  for (int u = 0; u < num_units(); ++u)
    std::fill(unit_grads_[u], unit_grads_[u] + (units_[u].second - units_[u].first), 0.0f);
}

// ---- buffers ----

size_t Activations::Block::floats() const {
  size_t n = 0;
  for (const auto* v : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &att, &atty, &res2, &ln2, &ln2_mean,
                        &ln2_rstd, &fch, &fch_gelu})
    n += v->size();
  return n;
}

size_t Activations::BlockGrads::floats() const {
  return mlp_out.size() + fch.size() + attn_out.size() + qkv.size();
}

size_t Activations::block_bytes() const {
  size_t n = 0;
  for (size_t i = 0; i < blocks.size(); ++i) n += resid[i].size() + blocks[i].floats();
  return n * sizeof(float);
}

size_t Activations::bytes() const {
  size_t n = block_bytes() / sizeof(float) + (resid.empty() ? 0 : resid.back().size());
  for (const BlockGrads& g : grads) n += g.floats();
  for (const auto* v : {&lnf, &lnf_mean, &lnf_rstd, &lnf_all, &logits, &losses, &loss_max,
                        &loss_sum, &loss_target, &d_embed, &input_grad})
    n += v->size();
  return n * sizeof(float);
}

std::vector<Floats*> Activations::buffers() {
  std::vector<Floats*> out;
  for (auto& r : resid) out.push_back(&r);
  for (Block& b : blocks)
    for (auto* v : {&b.ln1, &b.ln1_mean, &b.ln1_rstd, &b.qkv, &b.att, &b.atty, &b.res2, &b.ln2,
                    &b.ln2_mean, &b.ln2_rstd, &b.fch, &b.fch_gelu})
      out.push_back(v);
  for (auto* v : {&lnf, &lnf_mean, &lnf_rstd, &lnf_all, &logits}) out.push_back(v);
  return out;
}

namespace {
void size_block(Activations::Block& a, const std::shared_ptr<kernels::Memory>& m, size_t N,
                size_t R, size_t C, size_t Cl, size_t att) {
  for (auto* v : {&a.ln1, &a.res2, &a.ln2}) *v = Floats(m, R * C);
  for (auto* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) *v = Floats(m, R);
  a.qkv = Floats(m, 3 * N * Cl);
  a.att = Floats(m, att);
  a.atty = Floats(m, N * Cl);
  a.fch = Floats(m, 4 * N * Cl);
  a.fch_gelu = Floats(m, 4 * N * Cl);
}
}  // namespace

// The model's scratch for (B,T) micro-batches: one block's worth, whatever the depth.
void Gpt::allocate_scratch(int B, int T) {
  if (B == B_ && T == T_ && recompute_acts_.fch.empty() == (recompute_every_ == 0)) return;
  B_ = B, T_ = T;
  N_ = B * T;
  if (sp_ && N_ % tp_ != 0)
    throw UserError("sequence parallelism splits the " + std::to_string(N_) +
                        " token rows of a micro-batch (micro-batch x sequence length) " +
                        std::to_string(tp_) + " ways, which does not divide",
                    "make train.micro_batch x train.seq_len a multiple of train.tp");
  R_ = rows(B, T);
  row_begin_ = sp_ ? split_.rank * R_ : 0;
  const size_t C = cfg_.n_embd, N = N_, R = R_, Cl = Cl_;
  const size_t att = static_cast<size_t>(B) * NHl_ * T * T;
  const std::shared_ptr<kernels::Memory> m = backend_->memory();
  recompute_acts_ = BlockActs{};
  if (recompute_every_ > 0) size_block(recompute_acts_, m, N, R, C, Cl, att);
  for (auto* v : {&proj_, &d_ln1_, &d_ln2_, &d_lnf_}) *v = Floats(m, N * C);
  dx_ = Floats(m, R * C);
  d_qkv_ = Floats(m, 3 * N * Cl);
  d_att_ = Floats(m, att);
  d_atty_ = Floats(m, N * Cl);
  d_fch_ = Floats(m, 4 * N * Cl);
  d_fch_gelu_ = Floats(m, 4 * N * Cl);
  const size_t sp_rows = sp_ ? R * C : 0, sp_all = sp_ ? N * C : 0;
  proj_rows_ = Floats(m, sp_rows);
  d_rows_ = Floats(m, sp_rows);
  gathered_ = Floats(m, sp_all);
  d_all_ = Floats(m, sp_all);
  d_lnparams_ = Floats(m, sp_ ? 2 * C : 0);
}

// Sizes `a` for units [first, last] on (B,T) micro-batches (kept when the shape repeats).
void Gpt::prepare(Activations& a, int first, int last, int B, int T) const {
  if (a.B == B && a.T == T && a.first == first && a.last == last &&
      a.recompute_every == recompute_every_)
    return;
  ++sizings_;
  a = Activations{};
  a.B = B, a.T = T, a.first = first, a.last = last, a.recompute_every = recompute_every_;
  const size_t C = cfg_.n_embd, N = static_cast<size_t>(B) * T, R = rows(B, T), Cl = Cl_;
  const size_t att = static_cast<size_t>(B) * NHl_ * T * T;
  const int fb = first_block(a), nb = std::max(0, last_block(a) - fb + 1);
  const std::shared_ptr<kernels::Memory> m = backend_->memory();
  for (int i = 0; i <= nb; ++i) a.resid.emplace_back(m, R * C);
  a.blocks.resize(nb);
  for (int i = 0; i < nb; ++i)
    if (!recomputed(fb + i)) size_block(a.blocks[i], m, N, R, C, Cl, att);
  a.grads.resize(nb);  // filled by a kInput backward
  for (BlockGrads& g : a.grads)
    for (auto* v : {&g.mlp_out, &g.fch, &g.attn_out, &g.qkv}) *v = Floats(m);
  for (auto* v : {&a.d_embed, &a.input_grad}) *v = Floats(m);
  a.tokens = kernels::Buffer<int>(m);
  a.targets = kernels::Buffer<int>(m);
  if (last == cfg_.n_layer + 1) {
    a.lnf = Floats(m, R * C);
    a.lnf_mean = Floats(m, R);
    a.lnf_rstd = Floats(m, R);
    a.lnf_all = Floats(m, sp_ ? N * C : 0);
    a.logits = Floats(m, N * Vl_);
    a.losses = Floats(m, N);
    for (auto* v : {&a.loss_max, &a.loss_sum}) *v = Floats(m, N);
    a.loss_target = Floats(m, tp_ > 1 ? N : 0);
  }
  if (first > 0) a.input_grad.zeros(R * C);
}

size_t Gpt::activation_bytes() const {
  size_t n = acts_.bytes() / sizeof(float) + recompute_acts_.floats();
  for (const auto* v : {&proj_, &proj_rows_, &gathered_, &dx_, &d_ln1_, &d_qkv_, &d_att_, &d_atty_,
                        &d_ln2_, &d_fch_, &d_fch_gelu_, &d_lnf_, &d_all_, &d_rows_, &d_lnparams_})
    n += v->size();
  return n * sizeof(float);
}

// ---- the tensor-parallel edges ----

// Under sequence parallelism, the (R,C) rows of every rank gathered into `all` (N,C): the
// forward of f (before a column-parallel linear) and the backward of g. Otherwise the rows
// are already all of them.
const float* Gpt::gather_rows(const float* rows, float* all) {
  if (!sp_) return rows;
  tp_comm_->allgather(rows, all, static_cast<size_t>(R_) * cfg_.n_embd);
  return all;
}

// The backward of f: each rank's input gradient of a column-parallel linear (N,C) covers
// only its columns' share; the sum over the group is the gradient (allreduce), or under
// sequence parallelism this rank's rows of it (reduce-scatter).
const float* Gpt::reduce_input_grad(float* partial) {
  if (tp_ == 1) return partial;
  const size_t n = static_cast<size_t>(N_) * cfg_.n_embd;
  if (!sp_) {
    tp_comm_->allreduce_sum(partial, n);
    return partial;
  }
  tp_comm_->reduce_scatter_sum(partial, d_rows_.data(), n / tp_);
  return d_rows_.data();
}

// out (N,C) = inp (N,K) @ w (C,K)^T + bias: a row-parallel linear followed by g. Each rank's
// product over its K columns is partial; the group's sum (allreduce, or reduce-scatter to
// this rank's rows) gets the bias once. Returns the (R,C) result.
const float* Gpt::row_parallel_linear(float* partial, const float* inp, Weight w, const float* bias,
                                      int K, const uint16_t* inp16) {
  const int C = cfg_.n_embd;
  if (tp_ == 1) {
    backend_->matmul_forward(partial, inp, w.f32, bias, N_, K, C, w.bf16, inp16);
    return partial;
  }
  backend_->matmul_forward(partial, inp, w.f32, nullptr, N_, K, C, w.bf16, inp16);
  float* out = partial;
  if (sp_) {
    out = proj_rows_.data();
    tp_comm_->reduce_scatter_sum(partial, out, static_cast<size_t>(R_) * C);
  } else {
    tp_comm_->allreduce_sum(partial, static_cast<size_t>(N_) * C);
  }
  backend_->bias_forward(out, bias, R_, C);
  return out;
}

// LayerNorm backward over the region's R rows: the input gradient and the weight and bias
// gradients together, in a whole backward and in the B pass of a split one alike — the
// weight gradients are two multiply-adds a value over the rows B has just read, and taking
// them in W would read its input and output gradient back from memory and keep the latter
// (a microbatch's order of accumulation is the same either way). Under sequence parallelism
// a rank's rows give only part of the weight and bias gradients: they are computed apart,
// summed over the group, then accumulated (Megatron's allreduce of sequence-parallel
// gradients).
void Gpt::layernorm_backward_rows(float* dx, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd) {
  const int C = cfg_.n_embd;
  float* pw = dw;
  float* pb = db;
  if (sp_) {
    d_lnparams_.zero();
    pw = d_lnparams_.data(), pb = pw + C;
  }
  backend_->layernorm_backward(dx, pw, pb, dout, inp, w, mean, rstd, R_, C);
  if (!sp_) return;
  tp_comm_->allreduce_sum(pw, 2 * static_cast<size_t>(C));
  backend_->residual_forward(dw, dw, pw, C);  // dw += pw, on the device
  backend_->residual_forward(db, db, pb, C);
}

void Gpt::linear_backward(BackwardPart part, float* dinp, float* dw, float* db, const float* dout,
                          const float* inp, Weight w, int N, int C, int OC, Floats* keep,
                          const uint16_t* dout16, bool assign) {
  if (part == BackwardPart::kWhole) {
    backend_->matmul_backward(dinp, dw, db, dout, inp, w.f32, N, C, OC, w.bf16, dout16, assign);
    return;
  }
  backend_->matmul_backward_input(dinp, dout, w.f32, N, C, OC, w.bf16, dout16, assign);
  if (keep) keep->copy_from(dout, static_cast<size_t>(N) * OC);  // else dout stays put
}

// ---- blocks ----

// One block: in (R,C) -> out (R,C), keeping what its backward reads in `a`.
void Gpt::block_forward(int l, BlockActs& a, const float* in, float* out) {
  const int B = B_, T = T_, C = cfg_.n_embd, N = N_, R = R_, Cl = Cl_, u = l + 1;
  const size_t rc = static_cast<size_t>(R) * C;
  const auto& o = block_offsets_;
  uint16_t* x16 = input_bf16(rc);
  backend_->layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), in,
                              p(u, o[kLn1w]), p(u, o[kLn1b]), R, C, x16);
  const float* x = gather_rows(a.ln1.data(), gathered_.data());
  backend_->matmul_forward(a.qkv.data(), x, p(u, o[kQkvw]), p(u, o[kQkvb]), N, C, 3 * Cl,
                           p16(u, o[kQkvw]), x16);
  backend_->attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, T, Cl, NHl_);
  const float* y =
      row_parallel_linear(proj_.data(), a.atty.data(), weight(u, o[kProjw]), p(u, o[kProjb]), Cl);
  x16 = input_bf16(rc);
  backend_->residual_layernorm_forward(a.res2.data(), a.ln2.data(), a.ln2_mean.data(),
                                       a.ln2_rstd.data(), in, y, p(u, o[kLn2w]), p(u, o[kLn2b]), R,
                                       C, x16);
  x = gather_rows(a.ln2.data(), gathered_.data());
  backend_->matmul_forward(a.fch.data(), x, p(u, o[kFcw]), p(u, o[kFcb]), N, C, 4 * Cl,
                           p16(u, o[kFcw]), x16);
  const size_t n4 = static_cast<size_t>(N) * 4 * Cl;
  x16 = backend_->staging_bf16(static_cast<int64_t>(n4));  // the product's input, also under SP
  backend_->gelu_forward(a.fch_gelu.data(), a.fch.data(), n4, x16);
  y = row_parallel_linear(proj_.data(), a.fch_gelu.data(), weight(u, o[kFcProjw]),
                          p(u, o[kFcProjb]), 4 * Cl, x16);
  backend_->residual_forward(out, a.res2.data(), y, rc);
}

// Room for the bf16 rounding of a product's input of n elements, written by the pass that
// produces the input (LayerNorm, GELU) so the product need not round it again; valid until
// the next product. Null where products read fp32, or where the input is gathered from the
// tensor-parallel group before its product (sequence parallelism: the local rows' rounding
// would not be the product's input).
uint16_t* Gpt::input_bf16(size_t n) {
  if (sp_) return nullptr;
  return backend_->staging_bf16(static_cast<int64_t>(n));
}

// The block's forward in reverse. dx holds d(out) on entry and d(in) on exit (R,C): the
// residual connections pass it through unchanged, the LayerNorm backwards add their
// branches to it. Under sequence parallelism the LayerNorm outputs are gathered again for
// the weight gradients rather than kept whole (activation memory / t). With part kInput
// the matrix products' input gradients only are computed and their output gradients are
// kept for block_weight_grads (the LayerNorms' weight gradients come here either way).
void Gpt::block_backward(int l, BlockActs& a, const float* in, float* dx, BackwardPart part,
                         BlockGrads* keep) {
  const int B = B_, T = T_, C = cfg_.n_embd, N = N_, Cl = Cl_, u = l + 1;
  const auto& o = block_offsets_;
  const bool whole = part == BackwardPart::kWhole;
  auto kept = [&](Floats BlockGrads::*f) { return whole ? nullptr : &(keep->*f); };
  // The block's gradient scratch (d_fch_gelu_, d_fch_, d_ln2_, d_atty_, d_qkv_, d_ln1_) has
  // one contribution each: its kernel writes it (`assign`) rather than adding to zeros. (So
  // with part kInput two of them can trade places with the W pass's kept buffers.)
  constexpr bool kAssign = true;
  // out = res2 + fcproj(gelu(fc(ln2(res2))))
  const float* dout = gather_rows(dx, d_all_.data());
  linear_backward(part, d_fch_gelu_.data(), g(u, o[kFcProjw]), g(u, o[kFcProjb]), dout,
                  a.fch_gelu.data(), weight(u, o[kFcProjw]), N, 4 * Cl, C,
                  kept(&BlockGrads::mlp_out), nullptr, kAssign);
  backend_->gelu_backward(d_fch_.data(), a.fch.data(), d_fch_gelu_.data(),
                          static_cast<size_t>(N) * 4 * Cl, kAssign);
  const float* x = whole ? gather_rows(a.ln2.data(), gathered_.data()) : nullptr;
  linear_backward(part, d_ln2_.data(), g(u, o[kFcw]), g(u, o[kFcb]), d_fch_.data(), x,
                  weight(u, o[kFcw]), N, C, 4 * Cl, nullptr, nullptr, kAssign);
  if (!whole) keep_for_weights(keep->fch, d_fch_);
  const float* dln = reduce_input_grad(d_ln2_.data());
  layernorm_backward_rows(dx, g(u, o[kLn2w]), g(u, o[kLn2b]), dln, a.res2.data(), p(u, o[kLn2w]),
                          a.ln2_mean.data(), a.ln2_rstd.data());
  // res2 = in + attproj(attention(qkv(ln1(in))))
  dout = gather_rows(dx, d_all_.data());
  linear_backward(part, d_atty_.data(), g(u, o[kProjw]), g(u, o[kProjb]), dout, a.atty.data(),
                  weight(u, o[kProjw]), N, Cl, C, kept(&BlockGrads::attn_out), nullptr, kAssign);
  backend_->attention_backward(d_qkv_.data(), d_att_.data(), d_atty_.data(), a.qkv.data(),
                               a.att.data(), B, T, Cl, NHl_, kAssign);
  x = whole ? gather_rows(a.ln1.data(), gathered_.data()) : nullptr;
  linear_backward(part, d_ln1_.data(), g(u, o[kQkvw]), g(u, o[kQkvb]), d_qkv_.data(), x,
                  weight(u, o[kQkvw]), N, C, 3 * Cl, nullptr, nullptr, kAssign);
  if (!whole) keep_for_weights(keep->qkv, d_qkv_);
  dln = reduce_input_grad(d_ln1_.data());
  layernorm_backward_rows(dx, g(u, o[kLn1w]), g(u, o[kLn1b]), dln, in, p(u, o[kLn1w]),
                          a.ln1_mean.data(), a.ln1_rstd.data());
}

// A B pass hands the W pass the output gradient in `scratch` (the model's gradient scratch
// for it), which it will not read again: the two buffers trade places (the scratch is
// rewritten before it is next read).
void Gpt::keep_for_weights(Floats& kept, Floats& scratch) {
  kept.resize_discard(scratch.size());
  kept.swap(scratch);
}

// The weight gradients block_backward(kInput) left, from the output gradients it kept.
void Gpt::block_weight_grads(int l, BlockActs& a, const BlockGrads& kept) {
  const int C = cfg_.n_embd, N = N_, Cl = Cl_, u = l + 1;
  const auto& o = block_offsets_;
  backend_->matmul_backward_weight(g(u, o[kFcProjw]), g(u, o[kFcProjb]), kept.mlp_out.data(),
                                   a.fch_gelu.data(), N, 4 * Cl, C);
  const float* x = gather_rows(a.ln2.data(), gathered_.data());
  backend_->matmul_backward_weight(g(u, o[kFcw]), g(u, o[kFcb]), kept.fch.data(), x, N, C, 4 * Cl);
  backend_->matmul_backward_weight(g(u, o[kProjw]), g(u, o[kProjb]), kept.attn_out.data(),
                                   a.atty.data(), N, Cl, C);
  x = gather_rows(a.ln1.data(), gathered_.data());
  backend_->matmul_backward_weight(g(u, o[kQkvw]), g(u, o[kQkvb]), kept.qkv.data(), x, N, C,
                                   3 * Cl);
}

// ---- embeddings and loss ----

// resid[0] (R,C) = wte[token] + wpe[position]. Vocab-parallel: each rank looks up the tokens
// its rows of wte hold (zero rows for the rest) and the group's sum is the lookup (g), exact
// since every other term is 0.
void Gpt::embed_forward(Activations& a) {
  const int C = cfg_.n_embd;
  const int* tokens = a.tokens.data();
  float* out = a.resid[0].data();
  if (tp_ == 1) {
    const float* wte = p(0, 0);
    if (lookup_rows_) {  // a table of the rows this microbatch reads, and tokens into it
      const size_t n = static_cast<size_t>(B_) * T_;
      lookup_index_.resize(n);
      a.tokens.to_host(lookup_index_.data());
      lookup_ids_.assign(lookup_index_.begin(), lookup_index_.end());
      std::sort(lookup_ids_.begin(), lookup_ids_.end());
      lookup_ids_.erase(std::unique(lookup_ids_.begin(), lookup_ids_.end()), lookup_ids_.end());
      for (int& t : lookup_index_)
        t = static_cast<int>(std::lower_bound(lookup_ids_.begin(), lookup_ids_.end(), t) -
                             lookup_ids_.begin());
      lookup_host_.resize(lookup_ids_.size() * C);
      lookup_rows_(lookup_ids_.data(), lookup_ids_.size(), lookup_host_.data());
      if (lookup_table_.memory() == nullptr)
        lookup_table_ = Floats(backend_->memory()),
        lookup_tokens_ = kernels::Buffer<int>(backend_->memory());
      lookup_table_.from_host(lookup_host_.data(), lookup_host_.size());
      lookup_tokens_.from_host(lookup_index_.data(), n);
      wte = lookup_table_.data(), tokens = lookup_tokens_.data();
    }
    backend_->encoder_forward(out, tokens, wte, p(0, tensors_[1].offset), B_, T_, C);
    return;
  }
  float* partial = sp_ ? proj_.data() : out;
  backend_->embedding_shard_forward(partial, tokens, p(0, 0), vocab_begin_, Vl_, N_, C);
  if (sp_)
    tp_comm_->reduce_scatter_sum(partial, out, static_cast<size_t>(R_) * C);
  else
    tp_comm_->allreduce_sum(out, static_cast<size_t>(N_) * C);
  backend_->position_forward(out, p(0, tensors_[1].offset), row_begin_, R_, T_, C);
}

// The embedding's gradients from dx (R,C), the gradient of its output: it has no input to
// pass a gradient to, so these are all of its backward.
void Gpt::embed_weight_grads(const int* tokens, const float* dx) {
  const int C = cfg_.n_embd;
  if (tp_ == 1) {
    backend_->encoder_backward(g(0, 0), g(0, tensors_[1].offset), dx, tokens, B_, T_, C);
    return;
  }
  const float* dout = gather_rows(dx, d_all_.data());
  backend_->embedding_shard_backward(g(0, 0), dout, tokens, vocab_begin_, Vl_, N_, C);
  backend_->position_backward(g(0, tensors_[1].offset), dout, 0, N_, T_, C);
}

// Mean cross-entropy of the logits (kept as they are without tensor parallelism; the
// vocab-parallel loss turns its shard into probabilities in place).
float Gpt::loss_forward(Activations& a, int from) {
  const float* logits = a.logits.data();
  const int* targets = a.targets.data();
  if (tp_ == 1) {
    backend_->crossentropy_forward(a.losses.data() + from, a.loss_max.data(), a.loss_sum.data(),
                                   logits, targets + from, N_ - from, cfg_.vocab_size,
                                   cfg_.padded_vocab_size);
  } else {
    LOOM_CHECK(from == 0);
    VocabShard shard{vocab_begin_, Vl_, vocab_valid_};
    vocab_parallel_cross_entropy(*backend_, *tp_comm_, a.logits.data(), a.losses.data(), targets,
                                 N_, shard,
                                 {a.loss_max.data(), a.loss_sum.data(), a.loss_target.data()});
  }
  return loss_share(a.losses, static_cast<size_t>(from), N_);  // the forward's one host read
}

float Gpt::loss_share(const Floats& losses, size_t from, int N) {
  std::vector<float> host(losses.size());
  losses.to_host(host.data());
  double sum = 0;
  for (size_t i = from; i < host.size(); ++i) sum += host[i];
  return static_cast<float>(sum / N);
}

void Gpt::check_token_ids(const int* ids, int n) const {
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= cfg_.vocab_size)
      throw UserError(
          "token id out of range for a vocabulary of " + std::to_string(cfg_.vocab_size),
          "the data was prepared with another tokenizer?");
}

// The head split's share (HeadShare): logits of the rows, their loss, and at once its
// backward, as the last stage's head does for its own rows.
float Gpt::head_share(const float* ln, const int* targets, int rows, int N, float scale,
                      float* dln) {
  const int C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size;
  LOOM_CHECK_MSG(tp_ == 1, "the head split runs without tensor parallelism");
  LOOM_CHECK(rows > 0 && rows < N);
  check_token_ids(targets, rows);
  const std::shared_ptr<kernels::Memory> m = backend_->memory();
  const size_t rc = static_cast<size_t>(rows) * C, rv = static_cast<size_t>(rows) * Vp;
  if (share_ln_.size() != rc) {
    share_ln_ = Floats(m, rc), share_dln_ = Floats(m, rc), share_logits_ = Floats(m, rv);
    for (auto* v : {&share_max_, &share_sum_, &share_losses_}) *v = Floats(m, rows);
    share_targets_ = kernels::Buffer<int>(m);
  }
  share_ln_.from_host(ln, rc);
  share_targets_.from_host(targets, static_cast<size_t>(rows));
  pass_ = "H";
  use(0, true);
  round_unit(0);
  backend_->matmul_forward(share_logits_.data(), share_ln_.data(), p(0, 0), nullptr, rows, C, Vp,
                           p16(0, 0));
  backend_->crossentropy_forward(share_losses_.data(), share_max_.data(), share_sum_.data(),
                                 share_logits_.data(), share_targets_.data(), rows, V, Vp);
  uint16_t* dlogits16 = backend_->staging_bf16(static_cast<int64_t>(rv));
  backend_->crossentropy_backward_inplace(share_logits_.data(), dlogits16, share_max_.data(),
                                          share_sum_.data(), scale / static_cast<float>(N),
                                          share_targets_.data(), rows, V, Vp);
  linear_backward(BackwardPart::kWhole, share_dln_.data(), g(0, 0), nullptr, share_logits_.data(),
                  share_ln_.data(), weight(0, 0), rows, C, Vp, nullptr, dlogits16, /*assign=*/true);
  done(0);
  share_dln_.to_host(dln);
  return loss_share(share_losses_, 0, N);
}

// ---- the passes ----

void Gpt::trace_unit(int u) {
  const std::string what = unit_head_              ? "head"
                           : u == 0                ? "embedding"
                           : u == cfg_.n_layer + 1 ? "final norm"
                                                   : "block " + std::to_string(u - 1);
  Trace::get().add(what + " " + pass_, "unit", unit_t0_, Trace::now_us(), Trace::kCompute);
  unit_t0_ = -1;
}

float Gpt::forward(const int* tokens, const int* targets, int B, int T) {
  return forward_units(acts_, 0, cfg_.n_layer + 1, tokens, targets, B, T, nullptr);
}

void Gpt::backward(float scale) {
  backward_units(acts_, scale, nullptr, BackwardPart::kWhole);
}

float Gpt::forward_units(Activations& a, int first, int last, const int* tokens, const int* targets,
                         int B, int T, const float* input, const HeadShare* share) {
  const int C = cfg_.n_embd, L = cfg_.n_layer, head = L + 1;
  LOOM_CHECK(first >= 0 && first <= last && last <= head);
  LOOM_CHECK(first > 0 || tokens);
  LOOM_CHECK(first == 0 || input);
  if (T > cfg_.block_size)
    throw UserError("sequence length " + std::to_string(T) + " exceeds the model's block size " +
                        std::to_string(cfg_.block_size),
                    "lower train.seq_len or pick a model with a longer context");
  const bool with_loss = last == head && targets;
  const int from = share ? share->rows : 0;  // the first row of the head run here
  LOOM_CHECK_MSG(!share || (with_loss && tp_ == 1 && from > 0 && from < B * T),
                 "a head share needs the loss, no tensor parallelism and 0 < rows < B*T");
  pass_ = "F";
  if (first == 0) check_token_ids(tokens, B * T);
  if (with_loss) check_token_ids(targets, B * T);
  LOOM_CHECK_MSG(tp_ == 1 || tp_comm_, "a tensor-parallel model needs set_tp_comm()");
  LOOM_CHECK_MSG(!a.weights_pending, "a forward over activations whose weight gradients are due");
  allocate_scratch(B, T);
  prepare(a, first, last, B, T);
  a.head_from = from;
  if (first == 0) a.tokens.from_host(tokens, static_cast<size_t>(B) * T);
  a.have_targets = with_loss;
  if (with_loss) a.targets.from_host(targets, static_cast<size_t>(B) * T);
  if (first == 0) {
    use(0);
    embed_forward(a);
    done(0);
  } else {
    a.resid[0].copy_from(input, static_cast<size_t>(R_) * C);
  }
  const int fb = first_block(a);
  for (int l = fb; l <= last_block(a); ++l) {
    use(l + 1);
    round_unit(l + 1);
    block_forward(l, acts_of(a, l), a.resid[l - fb].data(), a.resid[l - fb + 1].data());
    done(l + 1);
  }
  if (last != head) return 0;
  use(head);
  backend_->layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(),
                              a.resid.back().data(), p(head, 0), p(head, C), R_, C);
  done(head);
  if (share) share->norm_ready(a.lnf.data());  // rows [0, from) of it, to the other stage
  // The tied head is column-parallel over the vocabulary: f before it.
  const float* x = gather_rows(a.lnf.data(), a.lnf_all.data());
  use(0, true);
  round_unit(0);
  a.logits.resize_discard(static_cast<size_t>(N_ - from) * Vl_);
  backend_->matmul_forward(a.logits.data(), x + static_cast<size_t>(from) * C, p(0, 0), nullptr,
                           N_ - from, C, Vl_, p16(0, 0));
  done(0);
  return with_loss ? loss_forward(a, from) : 0;
}

void Gpt::backward_units(Activations& a, float scale, const float* dout, BackwardPart part,
                         const HeadShare* share) {
  const int C = cfg_.n_embd, L = cfg_.n_layer, head = L + 1, fb = first_block(a);
  const bool whole = part == BackwardPart::kWhole;
  const size_t rc = static_cast<size_t>(R_) * C;
  const int from = a.head_from, own = N_ - from;  // the head's rows run here: [from, N)
  const size_t skip = static_cast<size_t>(from) * C;
  LOOM_CHECK_MSG(a.weights_pending == (part == BackwardPart::kWeight),
                 "backward parts out of order (B, then W; or BW)");
  LOOM_CHECK_MSG(part == BackwardPart::kWeight || (from > 0) == (share && share->rows > 0),
                 "a backward takes the head share its forward had");
  pass_ = whole ? "BW" : part == BackwardPart::kInput ? "B" : "W";
  if (part == BackwardPart::kWeight) {
    // The weight gradients in the order a whole backward computes them.
    if (a.last == head) {
      use(0, true);
      backend_->matmul_backward_weight(g(0, 0), nullptr, a.logits.data(),
                                       (sp_ ? a.lnf_all.data() : a.lnf.data()) + skip, own, C, Vl_);
      done(0);
      if (a.first > 0) ready(0);
      ready(head);  // the final norm's gradients came in B
    }
    for (int l = last_block(a); l >= fb; --l) {
      use(l + 1);
      BlockActs& b = acts_of(a, l);
      if (recomputed(l)) block_forward(l, b, a.resid[l - fb].data(), a.resid[l - fb + 1].data());
      block_weight_grads(l, b, a.grads[l - fb]);
      done(l + 1);
      ready(l + 1);
    }
    if (a.first == 0) {
      use(0);
      embed_weight_grads(a.tokens.data(), a.d_embed.data());
      done(0);
      ready(0);
    }
    a.weights_pending = false;
    return;
  }
  if (a.last == head) {
    LOOM_CHECK_MSG(a.have_targets, "backward needs a forward with targets");
    a.have_targets = false;  // the logits become their gradient in place below
    const float dloss = scale / static_cast<float>(N_);
    // Without tensor parallelism the loss's backward also writes the bf16 copy of dlogits
    // that the head's two bf16 products read (null in fp32).
    uint16_t* dlogits16 = nullptr;
    if (tp_ == 1) {
      dlogits16 = backend_->staging_bf16(static_cast<int64_t>(own) * Vl_);
      backend_->crossentropy_backward_inplace(a.logits.data(), dlogits16, a.loss_max.data(),
                                              a.loss_sum.data(), dloss, a.targets.data() + from,
                                              own, cfg_.vocab_size, cfg_.padded_vocab_size);
    } else {
      vocab_parallel_cross_entropy_backward(*backend_, a.logits.data(), dloss, a.targets.data(), N_,
                                            {vocab_begin_, Vl_, vocab_valid_});
    }
    d_lnf_.zero();
    use(0, true);
    linear_backward(part, d_lnf_.data() + skip, g(0, 0), nullptr, a.logits.data(),
                    (sp_ ? a.lnf_all.data() : a.lnf.data()) + skip, weight(0, 0), own, C, Vl_,
                    nullptr, dlogits16);
    done(0);
    if (whole && a.first > 0) ready(0);
    // The other rows' input gradient, from the stage that ran their head.
    if (from > 0)
      backend_->memory()->from_host(d_lnf_.data(), share->input_grad(), skip * sizeof(float));
    dx_.zero();
    use(head);
    const float* dln = reduce_input_grad(d_lnf_.data());
    layernorm_backward_rows(dx_.data(), g(head, 0), g(head, C), dln, a.resid.back().data(),
                            p(head, 0), a.lnf_mean.data(), a.lnf_rstd.data());
    done(head);
    if (whole) ready(head);
  } else {
    dx_.copy_from(dout, rc);
  }
  for (int l = last_block(a); l >= fb; --l) {
    use(l + 1);
    BlockActs& b = acts_of(a, l);
    if (recomputed(l)) block_forward(l, b, a.resid[l - fb].data(), a.resid[l - fb + 1].data());
    block_backward(l, b, a.resid[l - fb].data(), dx_.data(), part,
                   whole ? nullptr : &a.grads[l - fb]);
    done(l + 1);
    if (whole) ready(l + 1);
  }
  if (a.first > 0) {
    a.input_grad.copy_from(dx_.data(), dx_.size());
  } else if (whole) {
    use(0);
    embed_weight_grads(a.tokens.data(), dx_.data());
    done(0);
    ready(0);
  } else {
    a.d_embed.copy_from(dx_.data(), dx_.size());
  }
  a.weights_pending = !whole;
}

}  // namespace loom::model
