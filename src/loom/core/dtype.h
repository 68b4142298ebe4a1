// Element types that travel through loom, and the 16-bit float conversions.
// bf16 and f16 are stored as raw uint16 bits; arithmetic on them happens in f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

enum class DType : uint8_t { kF32 = 0, kBF16, kF16, kF64, kI32, kI64, kU8, kCount };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view s);
bool dtype_is_float(DType t);

// Element i of a buffer of type t, as a double (for checks, tests and reports; not hot).
double load_element(DType t, const void* buf, size_t i);
// Stores v (rounded to t) as element i.
void store_element(DType t, void* buf, size_t i, double v);

// Round-to-nearest-even f32 -> bf16; NaN stays NaN (quiet).
// Branch-free (masks), so that loops over it vectorise.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  const uint32_t nan_mask = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  return static_cast<uint16_t>((rounded & ~nan_mask) | (quiet_nan & nan_mask));
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 conversions, round-to-nearest-even, with subnormals, inf and NaN.
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: value = man * 2^-24
    float f = static_cast<float>(man) * 5.9604644775390625e-8f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // below the smallest normal: subnormal or zero
    // Adding 0.5 (2^-1) aligns the mantissa so the FPU performs the rounding.
    float a;
    std::memcpy(&a, &abs, 4);
    float r = a + 0.5f;
    uint32_t ru;
    std::memcpy(&ru, &r, 4);
    return static_cast<uint16_t>(sign | (ru - 0x3f000000u));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (abs >> 13));
}

}  // namespace loom
