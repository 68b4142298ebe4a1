// GGUF v3 files, the format llama.cpp (and Ollama, LM Studio, ...) loads (docs/formats.md
// "GGUF"). Written directly:
//
//   "GGUF" | u32 version = 3 | u64 tensor_count | u64 metadata_count
//   metadata:     (string key | u32 type | value)*      string = u64 length | bytes
//   tensor infos: (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset)*
//   padding to general.alignment (32) | tensor data, each tensor at an aligned offset
//
// dims are ggml's ne: the row-major shape reversed (a PyTorch (out, in) matrix is written
// with dims (in, out), its bytes unchanged). The writer streams tensors one at a time into a
// temporary name and renames it into place; GgufFile reads the header back (tests, tools).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "loom/core/box.h"
#include "loom/core/dtype.h"

namespace loom::ckpt {

// ggml tensor types loom writes: F32 = 0, F16 = 1, BF16 = 30.
uint32_t ggml_type_of(DType t);

struct GgufTensor {
  std::string name;
  Shape shape;  // row-major (written reversed, as ggml's ne)
  DType dtype = DType::kF32;
  uint64_t offset = 0;  // from the start of the data (reader)
};

// A metadata value: the scalar types loom needs, and arrays of strings or of u32/i32/f32.
using GgufValue =
    std::variant<uint32_t, int32_t, float, bool, std::string, std::vector<std::string>,
                 std::vector<int32_t>, std::vector<float>, uint64_t>;

class GgufWriter {
 public:
  void set(const std::string& key, GgufValue v) { meta_.push_back({key, std::move(v)}); }
  void add_tensor(GgufTensor t) { tensors_.push_back(std::move(t)); }
  // fill(i, out) leaves tensor i's elements as float32 in out (sized for them); UserError
  // when path cannot be written.
  void write(const std::string& path,
             const std::function<void(size_t i, std::vector<float>& out)>& fill) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> meta_;
  std::vector<GgufTensor> tensors_;
};

// The header of a GGUF file: its metadata and tensor table. UserError naming the file when
// it is not GGUF v2/v3 or is cut short.
struct GgufFile {
  explicit GgufFile(const std::string& path);
  uint32_t version = 0;
  std::map<std::string, GgufValue> meta;
  std::vector<GgufTensor> tensors;
  uint64_t data_start = 0, file_size = 0;
};

}  // namespace loom::ckpt
