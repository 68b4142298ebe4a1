#include "loom/optim/adamw.h"

#include <algorithm>

#include "loom/core/check.h"
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

void AdamW::step(float* params, const float* grads, float grad_scale, double lr,
                 const AdamWParams& p, int64_t t) {
  step_all({{this, params, grads}}, grad_scale, lr, p, t);
}

// With the moments in a file: the ranges' chunks in order, chunk c read into one of the
// file's two buffers while chunk c-1 updates in the other; the I/O thread runs jobs in
// order, so a buffer is refilled only after its previous chunk was written back.
void AdamW::step_all(const std::vector<RangeStep>& ranges, float grad_scale, double lr,
                     const AdamWParams& p, int64_t t, const std::function<void(size_t)>& updated) {
  struct Chunk {
    size_t range;
    size_t lo, hi;  // elements of the range
  };
  std::vector<Chunk> chunks;
  MomentFile* file = nullptr;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const RangeStep& r = ranges[i];
    AdamW& a = *r.adam;
    if (!a.file_) {
      a.update(r.params, r.grads, a.m_.data(), a.v_.data(), 0, a.size(), grad_scale, lr, p, t);
      if (updated) updated(i);
      continue;
    }
    LOOM_CHECK_MSG(!file || file == a.file_, "AdamW::step_all: ranges of more than one file");
    file = a.file_;
    for (size_t lo = 0; lo < a.size(); lo += file->chunk())
      chunks.push_back({i, lo, std::min(a.size(), lo + file->chunk())});
  }
  if (chunks.empty()) return;
  std::shared_future<void> loaded[2];
  std::vector<std::shared_future<void>> saved;  // each checked: a failed write is an error
  // Moment `which` of chunk c in the file, and its buffer.
  auto at = [&](const Chunk& c, int which) {
    const AdamW& a = *ranges[c.range].adam;
    return a.offset_ + (which * a.size() + c.lo) * sizeof(float);
  };
  float* bufs[2][2];  // taken here, before the I/O thread runs a job
  for (int b : {0, 1})
    for (int w : {0, 1}) bufs[b][w] = file->buffer(b, w);
  auto buf = [&](size_t c, int which) { return bufs[c % 2][which]; };
  auto load = [&](size_t c) {
    loaded[c % 2] = file->io().submit([&, c] {
      for (int w : {0, 1})
        file->read(at(chunks[c], w), buf(c, w), (chunks[c].hi - chunks[c].lo) * sizeof(float));
    });
  };
  try {
    load(0);
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (c + 1 < chunks.size()) load(c + 1);
      loaded[c % 2].get();
      const Chunk& k = chunks[c];
      const RangeStep& r = ranges[k.range];
      r.adam->update(r.params, r.grads, buf(c, 0), buf(c, 1), k.lo, k.hi, grad_scale, lr, p, t);
      if (updated && k.hi == r.adam->size()) updated(k.range);
      saved.push_back(file->io().submit([&, c] {
        for (int w : {0, 1})
          file->write(at(chunks[c], w), buf(c, w), (chunks[c].hi - chunks[c].lo) * sizeof(float));
      }));
    }
    for (auto& s : saved) s.get();
  } catch (...) {
    // Queued jobs point at the chunk list and buffers: let the I/O thread finish them first.
    file->io().submit([] {}).wait();
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
