#include "loom/model/gpt.h"

#include <cmath>
#include <random>

#include "loom/core/check.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::model {
namespace k = kernels::cpu;

namespace {
enum BlockTensor {
  kLn1w,
  kLn1b,
  kQkvw,
  kQkvb,
  kProjw,
  kProjb,
  kLn2w,
  kLn2b,
  kFcw,
  kFcb,
  kFcProjw,
  kFcProjb,
  kCount
};
}

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

double GptConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer;
  const double matrix_params = vocab_size * C + L * (12 * C * C + 13 * C) + 2 * C;
  return 6 * matrix_params + 12 * L * C * T;
}

Gpt::Gpt(GptConfig cfg, bool own_storage) : cfg_(std::move(cfg)) {
  cfg_.validate();
  const int64_t C = cfg_.n_embd, L = cfg_.n_layer, Vp = cfg_.padded_vocab_size;
  size_t at = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int unit, bool decay) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    tensors_.push_back({name, std::move(shape), at, n, unit, decay});
    at += n;
  };
  units_.push_back({at, 0});
  add("wte", {Vp, C}, 0, true);
  add("wpe", {cfg_.block_size, C}, 0, true);
  units_[0].second = at;
  const std::vector<int64_t> shapes[kCount] = {{C}, {C}, {3 * C, C}, {3 * C}, {C, C},     {C},
                                               {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
  const char* names[kCount] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                               "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
  const bool decay[kCount] = {false, false, true, false, true, false,
                              false, false, true, false, true, false};
  for (int64_t l = 0; l < L; ++l) {
    units_.push_back({at, 0});
    for (int i = 0; i < kCount; ++i) {
      if (l == 0) block_offsets_.push_back(at - units_.back().first);
      add("h" + std::to_string(l) + "." + names[i], shapes[i], static_cast<int>(l) + 1, decay[i]);
    }
    units_.back().second = at;
  }
  units_.push_back({at, 0});
  add("lnfw", {C}, static_cast<int>(L) + 1, false);
  add("lnfb", {C}, static_cast<int>(L) + 1, false);
  units_.back().second = at;
  total_ = at;
  unit_params_.assign(units_.size(), nullptr);
  unit_grads_.assign(units_.size(), nullptr);
  if (own_storage) {
    params_.assign(at, 0.0f);
    grads_.assign(at, 0.0f);
    for (int u = 0; u < num_units(); ++u)
      bind_unit(u, params_.data() + units_[u].first, grads_.data() + units_[u].first);
  }
}

void Gpt::bind_unit(int u, float* params, float* grads) {
  unit_params_[u] = params;
  unit_grads_[u] = grads;
}

void Gpt::init(uint64_t seed) {
  LOOM_CHECK(!params_.empty());
  for (int u = 0; u < num_units(); ++u) init_unit(seed, u, params_.data() + units_[u].first);
}

void Gpt::init_unit(uint64_t seed, int u, float* out) const {
  // One generator per unit, so a rank can initialise any unit alone (ZeRO-3 never holds
  // the whole model) and get the values every other layout gets.
  std::mt19937_64 rng(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(u + 1));
  const float std_proj = 0.02f / std::sqrt(2.0f * cfg_.n_layer);
  const size_t base = units_[u].first;
  for (const Tensor& t : tensors_) {
    if (t.unit != u) continue;
    float* x = out + (t.offset - base);
    bool is_ln_w = t.name.ends_with("ln1w") || t.name.ends_with("ln2w") || t.name == "lnfw";
    if (is_ln_w) {
      std::fill(x, x + t.size, 1.0f);
    } else if (!t.decay) {
      std::fill(x, x + t.size, 0.0f);
    } else {
      float sd = (t.name.ends_with("attprojw") || t.name.ends_with("fcprojw")) ? std_proj : 0.02f;
      std::normal_distribution<float> d(0.0f, sd);
      for (size_t i = 0; i < t.size; ++i) x[i] = d(rng);
    }
  }
  if (u == 0) {  // padded vocabulary rows never receive gradient; keep them at zero
    const size_t C = cfg_.n_embd;
    std::fill(out + cfg_.vocab_size * C, out + cfg_.padded_vocab_size * C, 0.0f);
  }
}

void Gpt::zero_grad() {
  for (int u = 0; u < num_units(); ++u)
    std::fill(unit_grads_[u], unit_grads_[u] + (units_[u].second - units_[u].first), 0.0f);
}

void Gpt::allocate(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  const size_t L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, Vp = cfg_.padded_vocab_size;
  const size_t BT = static_cast<size_t>(B) * T, BTC = BT * C, att = B * NH * T * T;
  auto size_block = [&](BlockActs& a) {
    for (auto* v : {&a.ln1, &a.atty, &a.res2, &a.ln2}) v->assign(BTC, 0);
    for (auto* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) v->assign(BT, 0);
    a.qkv.assign(3 * BTC, 0);
    a.att.assign(att, 0);
    a.fch.assign(4 * BTC, 0);
    a.fch_gelu.assign(4 * BTC, 0);
  };
  resid_.assign(L + 1, std::vector<float>(BTC, 0));
  blocks_.assign(L, BlockActs{});
  for (size_t l = 0; l < L; ++l)
    if (!recomputed(static_cast<int>(l))) size_block(blocks_[l]);
  recompute_acts_ = BlockActs{};
  if (recompute_every_ > 0) size_block(recompute_acts_);
  for (auto* v : {&attproj_, &fcproj_, &lnf_, &dx_, &d_ln1_, &d_atty_, &d_ln2_, &d_lnf_})
    v->assign(BTC, 0);
  for (auto* v : {&lnf_mean_, &lnf_rstd_, &losses_}) v->assign(BT, 0);
  d_qkv_.assign(3 * BTC, 0);
  d_att_.assign(att, 0);
  d_fch_.assign(4 * BTC, 0);
  d_fch_gelu_.assign(4 * BTC, 0);
  logits_.assign(BT * Vp, 0);
}

size_t Gpt::activation_bytes() const {
  size_t n = 0;
  auto add_block = [&](const BlockActs& a) {
    for (const auto* v : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.res2,
                          &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu})
      n += v->size();
  };
  for (const auto& r : resid_) n += r.size();
  for (const auto& b : blocks_) add_block(b);
  add_block(recompute_acts_);
  for (const auto* v :
       {&attproj_, &fcproj_, &lnf_, &lnf_mean_, &lnf_rstd_, &logits_, &losses_, &dx_, &d_ln1_,
        &d_qkv_, &d_att_, &d_atty_, &d_ln2_, &d_fch_, &d_fch_gelu_, &d_lnf_})
    n += v->size();
  return n * sizeof(float);
}

// One block: in (B,T,C) -> out (B,T,C), keeping what its backward reads in `a`.
void Gpt::block_forward(int l, BlockActs& a, const float* in, float* out) {
  const int B = B_, T = T_, C = cfg_.n_embd, NH = cfg_.n_head, BT = B * T, u = l + 1;
  const size_t btc = static_cast<size_t>(BT) * C;
  const auto& o = block_offsets_;
  k::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), in, p(u, o[kLn1w]),
                       p(u, o[kLn1b]), BT, C);
  k::matmul_forward(gemm_, a.qkv.data(), a.ln1.data(), p(u, o[kQkvw]), p(u, o[kQkvb]), BT, C,
                    3 * C);
  k::attention_forward(gemm_, a.atty.data(), a.att.data(), a.qkv.data(), B, T, C, NH);
  k::matmul_forward(gemm_, attproj_.data(), a.atty.data(), p(u, o[kProjw]), p(u, o[kProjb]), BT, C,
                    C);
  k::residual_forward(a.res2.data(), in, attproj_.data(), btc);
  k::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(),
                       p(u, o[kLn2w]), p(u, o[kLn2b]), BT, C);
  k::matmul_forward(gemm_, a.fch.data(), a.ln2.data(), p(u, o[kFcw]), p(u, o[kFcb]), BT, C, 4 * C);
  k::gelu_forward(a.fch_gelu.data(), a.fch.data(), btc * 4);
  k::matmul_forward(gemm_, fcproj_.data(), a.fch_gelu.data(), p(u, o[kFcProjw]), p(u, o[kFcProjb]),
                    BT, 4 * C, C);
  k::residual_forward(out, a.res2.data(), fcproj_.data(), btc);
}

// The block's forward in reverse. dx holds d(out) on entry and d(in) on exit: the residual
// connections pass it through unchanged, the LayerNorm backwards add their branches to it.
void Gpt::block_backward(int l, BlockActs& a, const float* in, float* dx) {
  const int B = B_, T = T_, C = cfg_.n_embd, NH = cfg_.n_head, BT = B * T, u = l + 1;
  const size_t btc = static_cast<size_t>(BT) * C;
  const auto& o = block_offsets_;
  for (auto* v : {&d_ln1_, &d_qkv_, &d_atty_, &d_ln2_, &d_fch_, &d_fch_gelu_})
    std::fill(v->begin(), v->end(), 0.0f);
  // out = res2 + fcproj(gelu(fc(ln2(res2))))
  k::matmul_backward(gemm_, d_fch_gelu_.data(), g(u, o[kFcProjw]), g(u, o[kFcProjb]), dx,
                     a.fch_gelu.data(), p(u, o[kFcProjw]), BT, 4 * C, C);
  k::gelu_backward(d_fch_.data(), a.fch.data(), d_fch_gelu_.data(), 4 * btc);
  k::matmul_backward(gemm_, d_ln2_.data(), g(u, o[kFcw]), g(u, o[kFcb]), d_fch_.data(),
                     a.ln2.data(), p(u, o[kFcw]), BT, C, 4 * C);
  k::layernorm_backward(dx, g(u, o[kLn2w]), g(u, o[kLn2b]), d_ln2_.data(), a.res2.data(),
                        p(u, o[kLn2w]), a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
  // res2 = in + attproj(attention(qkv(ln1(in))))
  k::matmul_backward(gemm_, d_atty_.data(), g(u, o[kProjw]), g(u, o[kProjb]), dx, a.atty.data(),
                     p(u, o[kProjw]), BT, C, C);
  k::attention_backward(gemm_, d_qkv_.data(), d_att_.data(), d_atty_.data(), a.qkv.data(),
                        a.att.data(), B, T, C, NH);
  k::matmul_backward(gemm_, d_ln1_.data(), g(u, o[kQkvw]), g(u, o[kQkvb]), d_qkv_.data(),
                     a.ln1.data(), p(u, o[kQkvw]), BT, C, 3 * C);
  k::layernorm_backward(dx, g(u, o[kLn1w]), g(u, o[kLn1b]), d_ln1_.data(), in, p(u, o[kLn1w]),
                        a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
}

float Gpt::forward(const int* tokens, const int* targets, int B, int T) {
  if (T > cfg_.block_size)
    throw UserError("sequence length " + std::to_string(T) + " exceeds the model's block size " +
                        std::to_string(cfg_.block_size),
                    "lower train.seq_len or pick a model with a longer context");
  for (int i = 0; i < B * T; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size ||
        (targets && (targets[i] < 0 || targets[i] >= cfg_.vocab_size)))
      throw UserError(
          "token id out of range for a vocabulary of " + std::to_string(cfg_.vocab_size),
          "the data was prepared with another tokenizer?");
  allocate(B, T);
  tokens_.assign(tokens, tokens + B * T);
  have_targets_ = targets != nullptr;
  if (targets) targets_.assign(targets, targets + B * T);
  const int C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size, BT = B * T;
  const int L = cfg_.n_layer, head = L + 1;
  use(0);
  k::encoder_forward(resid_[0].data(), tokens, p(0, 0), p(0, tensors_[1].offset), B, T, C);
  done(0);
  for (int l = 0; l < L; ++l) {
    use(l + 1);
    block_forward(l, acts_of(l), resid_[l].data(), resid_[l + 1].data());
    done(l + 1);
  }
  use(head);
  k::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), resid_[L].data(),
                       p(head, 0), p(head, C), BT, C);
  done(head);
  use(0);
  k::matmul_forward(gemm_, logits_.data(), lnf_.data(), p(0, 0), nullptr, BT, C, Vp);
  done(0);
  if (!targets) return 0;
  float* probs = logits_.data();  // in place from here on
  k::softmax_forward(probs, logits_.data(), BT, V, Vp);
  k::crossentropy_forward(losses_.data(), probs, targets, BT, Vp);
  double sum = 0;
  for (float x : losses_) sum += x;
  return static_cast<float>(sum / BT);
}

void Gpt::backward(float scale) {
  LOOM_CHECK_MSG(have_targets_, "backward() needs a forward() with targets");
  have_targets_ = false;  // the probabilities are consumed in place below
  const int B = B_, T = T_, C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size;
  const int BT = B * T, L = cfg_.n_layer, head = L + 1;
  float* dlogits = logits_.data();
  k::crossentropy_softmax_backward_inplace(dlogits, scale / BT, targets_.data(), BT, V, Vp);
  std::fill(d_lnf_.begin(), d_lnf_.end(), 0.0f);
  use(0);
  k::matmul_backward(gemm_, d_lnf_.data(), g(0, 0), nullptr, dlogits, lnf_.data(), p(0, 0), BT, C,
                     Vp);
  done(0);
  std::fill(dx_.begin(), dx_.end(), 0.0f);
  use(head);
  k::layernorm_backward(dx_.data(), g(head, 0), g(head, C), d_lnf_.data(), resid_[L].data(),
                        p(head, 0), lnf_mean_.data(), lnf_rstd_.data(), BT, C);
  done(head);
  if (hooks_) hooks_->grads_ready(head);
  for (int l = L - 1; l >= 0; --l) {
    use(l + 1);
    BlockActs& a = acts_of(l);
    if (recomputed(l)) block_forward(l, a, resid_[l].data(), resid_[l + 1].data());
    block_backward(l, a, resid_[l].data(), dx_.data());
    done(l + 1);
    if (hooks_) hooks_->grads_ready(l + 1);
  }
  use(0);
  k::encoder_backward(g(0, 0), g(0, tensors_[1].offset), dx_.data(), tokens_.data(), B, T, C);
  done(0);
  if (hooks_) hooks_->grads_ready(0);
}

}  // namespace loom::model
