#include "loom/optim/adamw.h"

#include <algorithm>

#include "loom/kernels/cpu/kernels.h"

namespace loom::optim {

AdamW::AdamW(const std::vector<DecaySpan>& spans, size_t begin, size_t end, MomentFile* file)
    : begin_(begin), end_(end), file_(file) {
  for (const auto& s : spans) {
    const size_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
    if (lo < hi) spans_.push_back({lo - begin, hi - begin, s.decay});
  }
  if (file_)
    offset_ = file_->allocate(2 * size() * sizeof(float));
  else
    m_.assign(size(), 0.0f), v_.assign(size(), 0.0f);
}

void AdamW::update(float* params, const float* grads, float* m, float* v, size_t lo, size_t hi,
                   float grad_scale, double lr, const AdamWParams& p, int64_t t) {
  for (const DecaySpan& s : spans_) {
    const size_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a >= b) continue;
    float *pa = params + a, *ma = m + (a - lo), *va = v + (a - lo);
    const float wd = s.decay ? p.weight_decay : 0.0f, lr32 = static_cast<float>(lr);
    if (backend_)
      backend_->adamw_update(pa, grads + a, ma, va, b - a, lr32, p.beta1, p.beta2, p.eps, wd,
                             static_cast<int>(t), grad_scale);
    else
      kernels::cpu::adamw_update(pa, grads + a, ma, va, b - a, lr32, p.beta1, p.beta2, p.eps, wd,
                                 static_cast<int>(t), grad_scale);
  }
}

// With the moments in a file: chunk c is read into one of two buffers while chunk c-1
// updates in the other; the I/O thread runs jobs in order, so a buffer is refilled only
// after its previous chunk was written back.
void AdamW::step(float* params, const float* grads, float grad_scale, double lr,
                 const AdamWParams& p, int64_t t) {
  if (!file_) {
    update(params, grads, m_.data(), v_.data(), 0, size(), grad_scale, lr, p, t);
    return;
  }
  constexpr size_t kChunk = size_t{1} << 21;  // floats: 8 MiB of m and 8 of v
  const size_t n = size(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> buf[2][2];  // [buffer][m, v]
  std::shared_future<void> loaded[2], saved;
  auto span = [&](size_t c) { return std::pair{c * kChunk, std::min(n, (c + 1) * kChunk)}; };
  auto load = [&](size_t c) {
    // (Named variables, not a structured binding: clang 14 cannot capture one.)
    const size_t lo = span(c).first, hi = span(c).second;
    auto& b = buf[c % 2];
    for (auto& x : b) x.resize(kChunk);
    loaded[c % 2] = file_->io().submit([this, &b, lo, hi] {
      file_->read(offset_ + lo * sizeof(float), b[0].data(), (hi - lo) * sizeof(float));
      file_->read(offset_ + (size() + lo) * sizeof(float), b[1].data(), (hi - lo) * sizeof(float));
    });
  };
  try {
    if (chunks > 0) load(0);
    for (size_t c = 0; c < chunks; ++c) {
      if (c + 1 < chunks) load(c + 1);
      loaded[c % 2].get();
      const size_t lo = span(c).first, hi = span(c).second;
      auto& b = buf[c % 2];
      update(params, grads, b[0].data(), b[1].data(), lo, hi, grad_scale, lr, p, t);
      saved = file_->io().submit([this, &b, lo, hi] {
        file_->write(offset_ + lo * sizeof(float), b[0].data(), (hi - lo) * sizeof(float));
        file_->write(offset_ + (size() + lo) * sizeof(float), b[1].data(),
                     (hi - lo) * sizeof(float));
      });
    }
    if (saved.valid()) saved.get();
  } catch (...) {
    // Queued jobs point at the buffers: let the I/O thread finish them before unwinding.
    file_->io().submit([] {}).wait();
    throw;
  }
}

void AdamW::read(Moment which, size_t offset, size_t n, float* out) const {
  if (!file_) {
    const StateVector& x = which == kM ? m_ : v_;
    std::copy(x.begin() + offset, x.begin() + offset + n, out);
    return;
  }
  file_->read(offset_ + ((which == kM ? 0 : size()) + offset) * sizeof(float), out,
              n * sizeof(float));
}

void AdamW::write(Moment which, size_t offset, size_t n, const float* in) {
  if (!file_) {
    std::copy(in, in + n, (which == kM ? m_ : v_).begin() + offset);
    return;
  }
  file_->write(offset_ + ((which == kM ? 0 : size()) + offset) * sizeof(float), in,
               n * sizeof(float));
}

}  // namespace loom::optim
