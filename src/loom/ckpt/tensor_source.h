// Where a model's named tensors can be read from: a loom checkpoint (ckpt::Reader), or an
// imported model file in loom's names and layouts (interop/model_files.h). Loading weights
// into any parallel layout needs only this: each rank reads the regions it holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/box.h"

namespace loom::ckpt {

// Elements [begin, begin + count) of the box (start, extent) of a tensor, in the box's
// row-major order. An empty start/extent is the whole tensor (begin/count then index the
// flattened tensor).
struct Region {
  Shape start, extent;
  int64_t begin = 0, count = 0;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool has(const std::string& tensor) const = 0;
  virtual Shape shape(const std::string& tensor) const = 0;
  // The region of tensor (whole shape `shape`) into out (region.count floats); UserError
  // naming the file and the tensor when it is missing, of another shape or damaged.
  virtual void read(const std::string& tensor, const Shape& shape, const Region& region,
                    float* out) const = 0;
};

}  // namespace loom::ckpt
