// safetensors files (docs/formats.md "safetensors"), read and written directly.
//
//   u64 N (little-endian) | N bytes of JSON header | data
//   header: {"NAME": {"dtype": "F32"|"F16"|"BF16"|..., "shape": [...],
//                     "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
//
// Offsets are relative to the start of the data; tensors are row-major little-endian, lie
// back to back and cover the data exactly. The reader checks all of that before it reads a
// byte of data, so a truncated file or a header that lies is one UserError naming the file
// and the tensor, not a crash or garbage weights. The writer streams one tensor at a time
// (a 1.5 B-parameter model needs one tensor's memory, not the model's) into a temporary
// name and renames it into place.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "loom/core/box.h"
#include "loom/core/dtype.h"

namespace loom::ckpt {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;  // F32, F16 or BF16 (F64, I32 and I64 are read as well)
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data (reader), or 0 (writer)
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // reads and checks the header
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;  // null when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's elements as float32 (converted from its dtype).
  std::vector<float> read_f32(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (name, dtype, shape; in this order in the file) to path: fill(i, out)
// must leave tensor i's elements as float32 in out (out is sized for them); they are stored
// converted to the tensor's dtype. UserError when path exists or cannot be written.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::function<void(size_t i, std::vector<float>& out)>& fill,
                       const std::map<std::string, std::string>& metadata);

// Converts n floats to dtype (F32, F16 or BF16) bytes at out.
void encode_floats(DType dtype, const float* in, size_t n, void* out);

}  // namespace loom::ckpt
