// Generation with a key/value cache: the rule of the file is the training forward's
// (model/gpt.cc block_forward), run on the rows being appended, with attention over the
// cache. Shapes: R rows appended, C channels, NH heads of hs = C/NH, L layers; the cache of
// layer l holds keys and values as (batch, NH, block_size, hs).
#include "loom/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

#include "loom/core/check.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom::model {

void SampleOptions::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw UserError("--temperature " + std::to_string(temperature) + " is not a number >= 0",
                    "0 picks the most likely token; 0.8 is the default");
  if (top_k < 0)
    throw UserError("--top-k " + std::to_string(top_k) + " is negative",
                    "0 samples among all tokens; 40 is the default");
  if (!(top_p > 0 && top_p <= 1))
    throw UserError("--top-p " + std::to_string(top_p) + " is not in (0, 1]",
                    "0.9 keeps the most likely tokens that make up 90% of the probability");
}

int draw_token(const float* logits, int V, const SampleOptions& o, std::mt19937_64& rng) {
  if (o.temperature <= 0) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  const int kk = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> w(kk);
  const double top = logits[idx[0]];
  double total = 0;
  for (int i = 0; i < kk; ++i) total += w[i] = std::exp((logits[idx[i]] - top) / o.temperature);
  int keep = kk;  // nucleus: the fewest most likely tokens holding top_p of the mass
  if (o.top_p < 1) {
    double acc = 0;
    for (int i = 0; i < kk; ++i)
      if ((acc += w[i]) >= o.top_p * total) {
        keep = i + 1;
        break;
      }
  }
  std::discrete_distribution<int> d(w.begin(), w.begin() + keep);
  return idx[d(rng)];
}

KvDecoder::KvDecoder(const Gpt& model, int batch, bool bf16_weights)
    : cfg_(model.config()),
      model_(model),
      backend_(kernels::make_backend(model.backend().name(), kernels::Precision::kF32)),
      mem_(backend_->memory()) {
  LOOM_CHECK(model.split().size == 1);
  LOOM_CHECK(batch >= 1);
  len_.assign(batch, 0);
  const size_t per_layer = static_cast<size_t>(batch) * cfg_.block_size * cfg_.n_embd;
  for (int l = 0; l < cfg_.n_layer; ++l)
    k_.emplace_back(mem_, per_layer), v_.emplace_back(mem_, per_layer);
  const size_t rows = std::max(cfg_.block_size, batch), C = cfg_.n_embd;
  for (auto* v : {&x_, &ln_, &atty_, &proj_}) *v = Floats(mem_, rows * C);
  qkv_ = Floats(mem_, rows * 3 * C);
  fch_ = Floats(mem_, rows * 4 * C);
  gelu_ = Floats(mem_, rows * 4 * C);
  mean_ = Floats(mem_, rows);
  rstd_ = Floats(mem_, rows);
  for (auto& b : rows_) b = kernels::Buffer<int>(mem_);
  for (auto& b : kv_) b = kernels::Buffer<const float*>(mem_);
  for (auto* b : {&att_, &logits_}) *b = Floats(mem_);
  wte_ = model.param("wte"), wpe_ = model.param("wpe");
  lnfw_ = model.param("lnfw"), lnfb_ = model.param("lnfb");
  if (!bf16_weights) return;
  auto copy = [&](const float* w, size_t n) {
    kernels::Buffer<uint16_t>& h = bf16_[w] = kernels::Buffer<uint16_t>(mem_);
    h.resize_discard(n);
    backend_->round_to_bf16(h.data(), w, static_cast<int64_t>(n));
  };
  copy(wte_, static_cast<size_t>(cfg_.padded_vocab_size) * C);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    copy(model.block_param(l, Gpt::kQkvw), 3 * C * C);
    copy(model.block_param(l, Gpt::kProjw), C * C);
    copy(model.block_param(l, Gpt::kFcw), 4 * C * C);
    copy(model.block_param(l, Gpt::kFcProjw), 4 * C * C);
  }
}

const float* KvDecoder::prefill(int b, const int* tokens, int n) {
  LOOM_CHECK(n >= 1 && len_[b] + n <= capacity());
  seq_.assign(n, b);
  pos_.resize(n);
  std::iota(pos_.begin(), pos_.end(), len_[b]);
  const float* logits = forward(n, seq_.data(), pos_.data(), tokens, {n - 1});
  len_[b] += n;
  return logits;
}

const float* KvDecoder::step(const std::vector<int>& seqs, const int* tokens) {
  pos_.clear();
  for (int b : seqs) {
    LOOM_CHECK(len_[b] < capacity());
    pos_.push_back(len_[b]);
  }
  std::vector<int> rows(seqs.size());
  std::iota(rows.begin(), rows.end(), 0);
  const float* logits =
      forward(static_cast<int>(seqs.size()), seqs.data(), pos_.data(), tokens, rows);
  for (int b : seqs) ++len_[b];
  return logits;
}

// A linear on R rows: on few rows (decoding) from the weight's bf16 copy when there is one,
// else from its fp32 weights by the few-row kernel, else (a prompt) through oneDNN. One row
// goes to the few-row kernel too: on Zen 5 it decoded `gpt2-124m` at 74-87 tokens/s against
// oneDNN's 43-47 (same greedy text; docs/perf.md, generation at batch 1).
void KvDecoder::linear(float* out, const float* inp, const float* w, const float* b, int R, int C,
                       int OC) {
  if (R > kFewRows) {
    backend_->matmul_forward(out, inp, w, b, R, C, OC);
    return;
  }
  const auto h = bf16_.find(w);
  if (h != bf16_.end())
    backend_->matmul_forward_rows_bf16(out, inp, h->second.data(), b, R, C, OC);
  else
    backend_->matmul_forward_rows(out, inp, w, b, R, C, OC);
}

const float* KvDecoder::forward(int R, const int* seq, const int* pos, const int* tok,
                                const std::vector<int>& out_rows) {
  const int C = cfg_.n_embd, NH = cfg_.n_head, hs = C / NH, ctx = cfg_.block_size;
  const int Vp = cfg_.padded_vocab_size;
  const size_t rc = static_cast<size_t>(R) * C;
  // One sequence from position 0: the training kernel's causal attention over the rows.
  bool from_start = pos[0] == 0;
  for (int r = 0; r < R && from_start; ++r) from_start = seq[r] == seq[0] && pos[r] == r;

  kernels::Buffer<int>&seq_d = rows_[0], &pos_d = rows_[1], &tok_d = rows_[2], &len_d = rows_[3];
  seq_d.from_host(seq, R), pos_d.from_host(pos, R), tok_d.from_host(tok, R);
  backend_->embed_rows(x_.data(), tok_d.data(), pos_d.data(), wte_, wpe_, R, C);
  if (!from_start) {  // each row's cached length, the same in every layer
    std::vector<int> n(R);
    for (int r = 0; r < R; ++r) n[r] = pos[r] + 1;
    len_d.from_host(n.data(), R);
  }
  for (int l = 0; l < cfg_.n_layer; ++l) {
    auto w = [&](Gpt::BlockTensor t) { return model_.block_param(l, t); };
    backend_->layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), w(Gpt::kLn1w),
                                w(Gpt::kLn1b), R, C);
    linear(qkv_.data(), ln_.data(), w(Gpt::kQkvw), w(Gpt::kQkvb), R, C, 3 * C);
    // The rows' keys and values join the cache: (R,3C) -> (batch, NH, ctx, hs).
    float *kc = k_[l].data(), *vc = v_[l].data();
    backend_->kv_append(kc, vc, qkv_.data(), seq_d.data(), pos_d.data(), R, C, NH, ctx);
    if (from_start) {
      att_.resize(static_cast<size_t>(NH) * R * R);
      backend_->attention_forward(atty_.data(), att_.data(), qkv_.data(), 1, R, C, NH);
    } else {  // row r (position p) attends to positions 0..p of its sequence in the cache
      att_.resize(static_cast<size_t>(R) * NH * ctx);
      std::vector<const float*> kr(R), vr(R);
      for (int r = 0; r < R; ++r) {
        const size_t seq_at = static_cast<size_t>(seq[r]) * NH * ctx * hs;
        kr[r] = kc + seq_at, vr[r] = vc + seq_at;
      }
      kv_[0].from_host(kr.data(), R), kv_[1].from_host(vr.data(), R);
      backend_->attention_decode(atty_.data(), att_.data(), qkv_.data(), kv_[0].data(),
                                 kv_[1].data(), len_d.data(), R, C, NH, ctx);
    }
    linear(proj_.data(), atty_.data(), w(Gpt::kProjw), w(Gpt::kProjb), R, C, C);
    backend_->residual_forward(x_.data(), x_.data(), proj_.data(), rc);
    backend_->layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), w(Gpt::kLn2w),
                                w(Gpt::kLn2b), R, C);
    linear(fch_.data(), ln_.data(), w(Gpt::kFcw), w(Gpt::kFcb), R, C, 4 * C);
    backend_->gelu_forward(gelu_.data(), fch_.data(), rc * 4);
    linear(proj_.data(), gelu_.data(), w(Gpt::kFcProjw), w(Gpt::kFcProjb), R, 4 * C, C);
    backend_->residual_forward(x_.data(), x_.data(), proj_.data(), rc);
  }
  // The final norm and the tied head on the rows whose logits are wanted.
  const int M = static_cast<int>(out_rows.size());
  for (int i = 0; i < M; ++i)
    mem_->copy(proj_.data() + static_cast<size_t>(i) * C,
               x_.data() + static_cast<size_t>(out_rows[i]) * C, C * sizeof(float));
  backend_->layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), proj_.data(), lnfw_, lnfb_, M,
                              C);
  logits_.resize(static_cast<size_t>(M) * Vp);
  linear(logits_.data(), ln_.data(), wte_, nullptr, M, C, Vp);
  return logits_.data();
}

std::vector<std::vector<int>> generate(Gpt& model, const std::vector<std::vector<int>>& prompts,
                                       int max_new, const SampleOptions& o, bool cache, int eot,
                                       GenerateStats* stats) {
  o.validate();
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  GenerateStats ignored;
  GenerateStats& st = stats ? *stats : ignored;
  const int ctx = model.config().block_size, V = model.config().vocab_size;
  const size_t Vp = model.config().padded_vocab_size;
  const int n = static_cast<int>(prompts.size());
  std::vector<std::vector<int>> ids(prompts), out(n);
  std::vector<std::mt19937_64> rng;
  for (int b = 0; b < n; ++b) {
    LOOM_CHECK(!ids[b].empty());
    rng.emplace_back(o.seed ^ (static_cast<uint64_t>(b) * 0x9E3779B97F4A7C15ULL));
  }
  if (!cache) {                   // the reference: the whole window again for every token
    std::vector<float> last(Vp);  // the logits of the window's last position
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < max_new; ++i) {
        const int T = static_cast<int>(std::min<size_t>(ids[b].size(), ctx));
        model.forward(ids[b].data() + ids[b].size() - T, nullptr, 1, T);
        model.backend().memory()->to_host(last.data(), model.logits() + (T - 1) * Vp,
                                          Vp * sizeof(float));
        const int next = draw_token(last.data(), V, o, rng[b]);
        if (i == 0 && b == n - 1) st.first_token_s = seconds();
        if (next == eot) break;
        ids[b].push_back(next);
        out[b].push_back(next);
      }
    st.total_s = seconds();
    return out;
  }
  KvDecoder dec(model, n, o.bf16_weights);
  std::vector<float> logits(n * Vp);  // each sequence's latest
  // (Re)starts sequence b's cache from its last `keep` tokens.
  auto refill = [&](int b, int keep) {
    dec.reset(b);
    const int T = static_cast<int>(std::min<size_t>(ids[b].size(), keep));
    dec.memory()->to_host(&logits[b * Vp], dec.prefill(b, ids[b].data() + ids[b].size() - T, T),
                          Vp * sizeof(float));
  };
  for (int b = 0; b < n; ++b) refill(b, ctx);
  st.first_token_s = seconds();
  std::vector<bool> done(n, max_new <= 0);
  std::vector<int> seqs, toks;
  while (std::find(done.begin(), done.end(), false) != done.end()) {
    seqs.clear(), toks.clear();
    for (int b = 0; b < n; ++b) {
      if (done[b]) continue;
      const int next = draw_token(&logits[b * Vp], V, o, rng[b]);
      if (next == eot) {
        done[b] = true;
        continue;
      }
      ids[b].push_back(next);
      out[b].push_back(next);
      if (static_cast<int>(out[b].size()) == max_new) {
        done[b] = true;  // its logits are not needed
      } else if (dec.length(b) == ctx) {
        refill(b, std::max(1, ctx / 2));
      } else {
        seqs.push_back(b), toks.push_back(next);
      }
    }
    if (seqs.empty()) continue;
    const float* lg = dec.step(seqs, toks.data());
    for (size_t i = 0; i < seqs.size(); ++i)
      dec.memory()->to_host(&logits[seqs[i] * Vp], lg + i * Vp, Vp * sizeof(float));
  }
  st.total_s = seconds();
  return out;
}

}  // namespace loom::model
