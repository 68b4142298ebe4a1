#include "loom/core/dtype.h"

namespace loom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kCount: break;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kCount: break;
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (int i = 0; i < static_cast<int>(DType::kCount); ++i) {
    auto t = static_cast<DType>(i);
    if (s == dtype_name(t)) return t;
  }
  if (s == "float" || s == "float32") return DType::kF32;
  if (s == "bfloat16") return DType::kBF16;
  if (s == "half" || s == "float16") return DType::kF16;
  if (s == "double" || s == "float64") return DType::kF64;
  if (s == "int32") return DType::kI32;
  if (s == "int64") return DType::kI64;
  if (s == "uint8") return DType::kU8;
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
}

}  // namespace loom
