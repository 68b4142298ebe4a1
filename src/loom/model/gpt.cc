#include "loom/model/gpt.h"

#include <cmath>
#include <random>

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

Gpt::Gpt(GptConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  const size_t C = cfg_.n_embd, L = cfg_.n_layer, Vp = cfg_.padded_vocab_size;
  size_t at = 0;
  auto add = [&](const std::string& name, size_t n, int unit, bool decay) {
    tensors_.push_back({name, at, n, unit, decay});
    at += n;
  };
  units_.push_back({at, 0});
  add("wte", Vp * C, 0, true);
  add("wpe", static_cast<size_t>(cfg_.block_size) * C, 0, true);
  units_[0].second = at;
  const size_t sizes[kCount] = {C, C, 3 * C * C, 3 * C, C * C,     C,
                                C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  const char* names[kCount] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                               "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
  const bool decay[kCount] = {false, false, true, false, true, false,
                              false, false, true, false, true, false};
  size_t off = 0;
  for (int i = 0; i < kCount; ++i) block_offsets_.push_back(off), off += sizes[i];
  block_size_ = off;
  for (size_t l = 0; l < L; ++l) {
    units_.push_back({at, 0});
    for (int i = 0; i < kCount; ++i)
      add("h" + std::to_string(l) + "." + names[i], sizes[i], static_cast<int>(l) + 1, decay[i]);
    units_.back().second = at;
  }
  units_.push_back({at, 0});
  add("lnfw", C, static_cast<int>(L) + 1, false);
  add("lnfb", C, static_cast<int>(L) + 1, false);
  units_.back().second = at;
  params_.assign(at, 0.0f);
  grads_.assign(at, 0.0f);
}

float* Gpt::p(int layer, int which) {
  return params_.data() + units_[layer + 1].first + block_offsets_[which];
}
float* Gpt::g(int layer, int which) {
  return grads_.data() + units_[layer + 1].first + block_offsets_[which];
}

void Gpt::init(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float std_proj = 0.02f / std::sqrt(2.0f * cfg_.n_layer);
  for (const Tensor& t : tensors_) {
    float* x = params_.data() + t.offset;
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
  // Padded vocabulary rows never receive gradient; keep them at zero.
  const size_t C = cfg_.n_embd;
  std::fill(params_.begin() + static_cast<std::ptrdiff_t>(cfg_.vocab_size * C),
            params_.begin() + static_cast<std::ptrdiff_t>(cfg_.padded_vocab_size * C), 0.0f);
}

void Gpt::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void Gpt::allocate(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  const size_t L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, Vp = cfg_.padded_vocab_size;
  const size_t BT = static_cast<size_t>(B) * T;
  for (Acts* a : {&acts_, &grads_acts_}) {
    a->encoded.assign(BT * C, 0);
    for (auto* v :
         {&a->ln1, &a->atty, &a->attproj, &a->residual2, &a->ln2, &a->fcproj, &a->residual3})
      v->assign(L * BT * C, 0);
    for (auto* v : {&a->ln1_mean, &a->ln1_rstd, &a->ln2_mean, &a->ln2_rstd}) v->assign(L * BT, 0);
    a->qkv.assign(L * BT * 3 * C, 0);
    a->preatt.assign(L * B * NH * T * T, 0);
    a->att.assign(L * B * NH * T * T, 0);
    a->fch.assign(L * BT * 4 * C, 0);
    a->fch_gelu.assign(L * BT * 4 * C, 0);
    a->lnf.assign(BT * C, 0);
    a->lnf_mean.assign(BT, 0);
    a->lnf_rstd.assign(BT, 0);
    a->logits.assign(BT * Vp, 0);
    a->probs.assign(BT * Vp, 0);
    a->losses.assign(BT, 0);
  }
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
  targets_.assign(targets ? targets : tokens, (targets ? targets : tokens) + B * T);
  const int C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size;
  const int BT = B * T;
  const size_t btc = static_cast<size_t>(BT) * C;
  Acts& a = acts_;
  const float* wte = params_.data() + tensors_[0].offset;
  const float* wpe = params_.data() + tensors_[1].offset;
  k::encoder_forward(a.encoded.data(), tokens, wte, wpe, B, T, C);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * btc;
    float* ln1 = a.ln1.data() + l * btc;
    float* qkv = a.qkv.data() + l * btc * 3;
    float* atty = a.atty.data() + l * btc;
    const size_t att_n = static_cast<size_t>(B) * NH * T * T;
    float* attproj = a.attproj.data() + l * btc;
    float* res2 = a.residual2.data() + l * btc;
    float* ln2 = a.ln2.data() + l * btc;
    float* fch = a.fch.data() + l * btc * 4;
    float* fchg = a.fch_gelu.data() + l * btc * 4;
    float* fcproj = a.fcproj.data() + l * btc;
    float* res3 = a.residual3.data() + l * btc;
    k::layernorm_forward(ln1, a.ln1_mean.data() + l * BT, a.ln1_rstd.data() + l * BT, residual,
                         p(l, kLn1w), p(l, kLn1b), BT, C);
    k::matmul_forward(qkv, ln1, p(l, kQkvw), p(l, kQkvb), BT, C, 3 * C);
    k::attention_forward(atty, a.preatt.data() + l * att_n, a.att.data() + l * att_n, qkv, B, T, C,
                         NH);
    k::matmul_forward(attproj, atty, p(l, kProjw), p(l, kProjb), BT, C, C);
    k::residual_forward(res2, residual, attproj, btc);
    k::layernorm_forward(ln2, a.ln2_mean.data() + l * BT, a.ln2_rstd.data() + l * BT, res2,
                         p(l, kLn2w), p(l, kLn2b), BT, C);
    k::matmul_forward(fch, ln2, p(l, kFcw), p(l, kFcb), BT, C, 4 * C);
    k::gelu_forward(fchg, fch, btc * 4);
    k::matmul_forward(fcproj, fchg, p(l, kFcProjw), p(l, kFcProjb), BT, 4 * C, C);
    k::residual_forward(res3, res2, fcproj, btc);
  }
  const float* last = a.residual3.data() + (cfg_.n_layer - 1) * btc;
  const Tensor& lnfw = tensors_[tensors_.size() - 2];
  k::layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), last,
                       params_.data() + lnfw.offset, params_.data() + lnfw.offset + C, BT, C);
  k::matmul_forward(a.logits.data(), a.lnf.data(), wte, nullptr, BT, C, Vp);
  if (!targets) return 0;
  k::softmax_forward(a.probs.data(), a.logits.data(), BT, V, Vp);
  k::crossentropy_forward(a.losses.data(), a.probs.data(), targets, BT, Vp);
  double sum = 0;
  for (float x : a.losses) sum += x;
  return static_cast<float>(sum / BT);
}

void Gpt::backward() {
  const int B = B_, T = T_, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size,
            Vp = cfg_.padded_vocab_size, BT = B * T;
  const size_t btc = static_cast<size_t>(BT) * C;
  const size_t att_n = static_cast<size_t>(B) * NH * T * T;
  Acts& a = acts_;
  Acts& d = grads_acts_;
  for (auto* v : {&d.encoded, &d.ln1, &d.qkv, &d.atty, &d.preatt, &d.att, &d.attproj, &d.residual2,
                  &d.ln2, &d.fch, &d.fch_gelu, &d.fcproj, &d.residual3, &d.lnf, &d.logits})
    std::fill(v->begin(), v->end(), 0.0f);
  std::fill(d.losses.begin(), d.losses.end(), 1.0f / BT);  // d(mean loss)/d(loss_i)
  float* wte = params_.data() + tensors_[0].offset;
  float* dwte = grads_.data() + tensors_[0].offset;
  float* dwpe = grads_.data() + tensors_[1].offset;
  const Tensor& lnfw = tensors_[tensors_.size() - 2];
  k::crossentropy_softmax_backward(d.logits.data(), d.losses.data(), a.probs.data(),
                                   targets_.data(), BT, V, Vp);
  k::matmul_backward(d.lnf.data(), dwte, nullptr, d.logits.data(), a.lnf.data(), wte, BT, C, Vp);
  const size_t lastoff = (cfg_.n_layer - 1) * btc;
  k::layernorm_backward(d.residual3.data() + lastoff, grads_.data() + lnfw.offset,
                        grads_.data() + lnfw.offset + C, d.lnf.data(), a.residual3.data() + lastoff,
                        params_.data() + lnfw.offset, a.lnf_mean.data(), a.lnf_rstd.data(), BT, C);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * btc;
    float* dresidual = l == 0 ? d.encoded.data() : d.residual3.data() + (l - 1) * btc;
    const size_t o = l * btc;
    k::residual_backward(d.residual2.data() + o, d.fcproj.data() + o, d.residual3.data() + o, btc);
    k::matmul_backward(d.fch_gelu.data() + 4 * o, g(l, kFcProjw), g(l, kFcProjb),
                       d.fcproj.data() + o, a.fch_gelu.data() + 4 * o, p(l, kFcProjw), BT, 4 * C,
                       C);
    k::gelu_backward(d.fch.data() + 4 * o, a.fch.data() + 4 * o, d.fch_gelu.data() + 4 * o,
                     4 * btc);
    k::matmul_backward(d.ln2.data() + o, g(l, kFcw), g(l, kFcb), d.fch.data() + 4 * o,
                       a.ln2.data() + o, p(l, kFcw), BT, C, 4 * C);
    k::layernorm_backward(d.residual2.data() + o, g(l, kLn2w), g(l, kLn2b), d.ln2.data() + o,
                          a.residual2.data() + o, p(l, kLn2w), a.ln2_mean.data() + l * BT,
                          a.ln2_rstd.data() + l * BT, BT, C);
    k::residual_backward(dresidual, d.attproj.data() + o, d.residual2.data() + o, btc);
    k::matmul_backward(d.atty.data() + o, g(l, kProjw), g(l, kProjb), d.attproj.data() + o,
                       a.atty.data() + o, p(l, kProjw), BT, C, C);
    k::attention_backward(d.qkv.data() + 3 * o, d.preatt.data() + l * att_n,
                          d.att.data() + l * att_n, d.atty.data() + o, a.qkv.data() + 3 * o,
                          a.att.data() + l * att_n, B, T, C, NH);
    k::matmul_backward(d.ln1.data() + o, g(l, kQkvw), g(l, kQkvb), d.qkv.data() + 3 * o,
                       a.ln1.data() + o, p(l, kQkvw), BT, C, 3 * C);
    k::layernorm_backward(dresidual, g(l, kLn1w), g(l, kLn1b), d.ln1.data() + o, residual,
                          p(l, kLn1w), a.ln1_mean.data() + l * BT, a.ln1_rstd.data() + l * BT, BT,
                          C);
  }
  k::encoder_backward(dwte, dwpe, d.encoded.data(), tokens_.data(), B, T, C);
}

}  // namespace loom::model
