#include "loom/optim/adamw.h"

#include <algorithm>

#include "loom/core/check.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::optim {

AdamW::AdamW(const std::vector<DecaySpan>& spans, size_t begin, size_t end, MomentFile* file,
             bool master)
    : begin_(begin), end_(end), file_(file), master_(master) {
  LOOM_CHECK_MSG(file || !master, "AdamW: master weights in a file need the moments' file");
  for (const auto& s : spans) {
    const size_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
    if (lo < hi) spans_.push_back({lo - begin, hi - begin, s.decay});
  }
  if (file_)
    offset_ = file_->allocate((master_ ? 3 : 2) * size() * sizeof(float));
  else
    m_.assign(size(), 0.0f), v_.assign(size(), 0.0f);
}

void AdamW::update(float* params, const float* grads, float* m, float* v, size_t lo, size_t hi,
                   float grad_scale, double lr, const AdamWParams& p, int64_t t) {
  for (const DecaySpan& s : spans_) {
    const size_t a = std::max(lo, s.begin), b = std::min(hi, s.end);
    if (a >= b) continue;
    float *pa = params + (a - lo), *ma = m + (a - lo), *va = v + (a - lo);
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
                     const AdamWParams& p, int64_t t, const std::function<void(size_t)>& updated,
                     const Fresh& fresh) {
  struct Chunk {
    size_t range;
    size_t lo, hi;  // elements of the range
  };
  std::vector<Chunk> chunks;
  MomentFile* file = nullptr;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const RangeStep& r = ranges[i];
    AdamW& a = *r.adam;
    LOOM_CHECK_MSG(!a.master_ || fresh, "AdamW::step_all: master weights in a file need `fresh`");
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
  // Slot `which` of chunk c in the file, and its buffer; how many slots its range has there.
  auto at = [&](const Chunk& c, int which) {
    return ranges[c.range].adam->file_offset(static_cast<Slot>(which), c.lo);
  };
  auto slots = [&](const Chunk& c) { return ranges[c.range].adam->master_ ? 3 : 2; };
  float* bufs[2][3];  // taken here, before the I/O thread runs a job
  for (int b : {0, 1})
    for (int w : {0, 1, 2}) bufs[b][w] = file->buffer(b, w);
  auto buf = [&](size_t c, int which) { return bufs[c % 2][which]; };
  auto load = [&](size_t c) {
    loaded[c % 2] = file->io().submit([&, c] {
      for (int w = 0; w < slots(chunks[c]); ++w)
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
      const bool master = r.adam->master_;
      r.adam->update(master ? buf(c, 2) : r.params + k.lo, r.grads, buf(c, 0), buf(c, 1), k.lo,
                     k.hi, grad_scale, lr, p, t);
      if (master) fresh(k.range, k.lo, k.hi, buf(c, 2));
      // A range is updated once its last chunk is; one with its master in the file, once
      // that chunk is written too (readers of the master read the file: Gpt::set_lookup_rows).
      const bool last = updated && k.hi == r.adam->size();
      if (last && !master) updated(k.range);
      saved.push_back(file->io().submit([&, c, done = last && master] {
        for (int w = 0; w < slots(chunks[c]); ++w)
          file->write(at(chunks[c], w), buf(c, w), (chunks[c].hi - chunks[c].lo) * sizeof(float));
        if (done) updated(chunks[c].range);
      }));
    }
    for (auto& s : saved) s.get();
  } catch (...) {
    // Queued jobs point at the chunk list and buffers: let the I/O thread finish them first.
    file->io().submit([] {}).wait();
    throw;
  }
}

void AdamW::read(Slot which, size_t offset, size_t n, float* out) const {
  LOOM_CHECK(which != kMaster || master_);
  LOOM_CHECK_LE(offset + n, size());
  if (!file_) {
    const StateVector& x = which == kM ? m_ : v_;
    std::copy(x.begin() + offset, x.begin() + offset + n, out);
    return;
  }
  file_->read(file_offset(which, offset), out, n * sizeof(float));
}

void AdamW::write(Slot which, size_t offset, size_t n, const float* in) {
  LOOM_CHECK(which != kMaster || master_);
  LOOM_CHECK_LE(offset + n, size());
  if (!file_) {
    std::copy(in, in + n, (which == kM ? m_ : v_).begin() + offset);
    return;
  }
  file_->write(file_offset(which, offset), in, n * sizeof(float));
}

}  // namespace loom::optim
