// Branch-free float math that the compiler vectorises, and the attribute that builds hot
// loops for several instruction sets with run-time dispatch (binaries must run on any
// x86-64; this machine has AVX-512). libm's expf/tanhf are scalar calls: they were 50% of
// a `tiny` training step (perf), in the vocabulary softmax.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define LOOM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LOOM_VECTOR_CLONES
#endif

namespace loom::kernels::cpu {

// e^x with relative error < 3e-7 for x in [-87, 88] (clamped outside): x = n ln2 + r,
// |r| <= ln2/2, e^r by a degree-6 Taylor polynomial, 2^n through the exponent bits.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504f + shifter) - shifter;
  // ln2 = 0.693359375 (9 bits: n * it is exact) - 2.12194440e-4
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh(x) = 1 - 2 / (e^{2x} + 1), saturating correctly at both ends through exp_approx.
inline float tanh_approx(float x) {
  return 1.0f - 2.0f / (exp_approx(2.0f * x) + 1.0f);
}

}  // namespace loom::kernels::cpu
