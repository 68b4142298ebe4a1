// AdamW over a contiguous range of a flat parameter layout: the whole model on one rank, a
// rank's shard under ZeRO. The optimizer knows ranges and decay flags, not the model.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "loom/core/state_memory.h"
#include "loom/kernels/backend.h"
#include "loom/optim/moment_file.h"

namespace loom::optim {

struct AdamWParams {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to spans marked decay only
};

// A span of the flat layout [begin, end) and whether weight decay applies to it (matrices
// and embeddings yes, biases and norms no).
struct DecaySpan {
  size_t begin, end;
  bool decay;
};

class AdamW {
 public:
  // Moments for elements [begin, end) of the layout; `spans` (in layout coordinates, in any
  // number) say where weight decay applies and are clipped to the range. With `file` the
  // moments live there (zero.offload = disk) and a step streams them through memory; with
  // `master` too the range's fp32 master weights live there (zero.offload_master), after
  // the moments, and stream with them: the caller's parameters are then a copy it derives
  // from each updated chunk (step_all's `fresh`), not what the update reads.
  AdamW(const std::vector<DecaySpan>& spans, size_t begin, size_t end, MomentFile* file = nullptr,
        bool master = false);
  // The kernels the update runs on (the model's backend; it must outlive this); without one,
  // the CPU kernel.
  void set_backend(kernels::Backend* b) { backend_ = b; }
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  size_t size() const { return end_ - begin_; }
  // params and grads point at element `begin` of the layout; grads are multiplied by
  // grad_scale (clipping) on the fly; t counts optimizer steps from 1.
  void step(float* params, const float* grads, float grad_scale, double lr, const AdamWParams& p,
            int64_t t);
  // One range's step: the optimizer, and its params and grads as step() takes them (params
  // unused, may be null, when the master weights are in the file).
  struct RangeStep {
    AdamW* adam;
    float* params;
    const float* grads;
  };
  // Steps every range, with the same bits as step() on each: ranges with their moments in
  // memory one by one, ranges whose moments are in a file as one stream through that file's
  // two buffers, the next range's first chunk read while the last one's update runs (a rank's
  // units are many ranges of one file). `updated(i)`, where given, is called once range i's
  // parameters are final (its moments may still be on their way to the file; they are written
  // when step_all returns); with its master weights in the file, once those are written back
  // too (called on the file's I/O thread then). With the master weights in the file,
  // `fresh(i, lo, hi, master)` is called with elements [lo, hi) of range i's master weights
  // once updated, before they go back to the file (the caller's working copy is made there),
  // and before updated(i).
  using Fresh = std::function<void(size_t range, size_t lo, size_t hi, const float* master)>;
  static void step_all(const std::vector<RangeStep>& ranges, float grad_scale, double lr,
                       const AdamWParams& p, int64_t t,
                       const std::function<void(size_t)>& updated = {}, const Fresh& fresh = {});
  // Elements [offset, offset + n) of the range's first (m) or second (v) moment or of its
  // master weights (kMaster: only where they live in the file), wherever they live
  // (checkpoints, loads).
  enum Slot { kM, kV, kMaster };
  void read(Slot which, size_t offset, size_t n, float* out) const;
  void write(Slot which, size_t offset, size_t n, const float* in);
  // The moment in memory, or null when it lives in the file.
  const float* in_memory(Slot which) const {
    return file_ ? nullptr : (which == kM ? m_ : v_).data();
  }

 private:
  // The update of elements [lo, hi) of the range: params, m and v point at element lo.
  void update(float* params, const float* grads, float* m, float* v, size_t lo, size_t hi,
              float grad_scale, double lr, const AdamWParams& p, int64_t t);
  size_t file_offset(Slot which, size_t element) const {
    return offset_ + (static_cast<size_t>(which) * size() + element) * sizeof(float);
  }

  size_t begin_, end_;
  std::vector<DecaySpan> spans_;  // relative to begin_
  StateVector m_, v_;             // in memory, or
  MomentFile* file_ = nullptr;    // in the file at offset_: m (size() floats), v, [master]
  bool master_ = false;
  size_t offset_ = 0;
  kernels::Backend* backend_ = nullptr;
};

}  // namespace loom::optim
