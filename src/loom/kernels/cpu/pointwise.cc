// Element-wise layers: GELU (tanh approximation) and the residual add.
//   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)
#include <cmath>

#include "loom/kernels/cpu/chunks.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {
namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
}

namespace {
LOOM_VECTOR_CLONES void gelu_forward_chunk(float* out, uint16_t* out16, const float* inp,
                                           size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanh_approx(kS * (x + 0.044715f * x * x * x)));
  }
  if (out16) round_to_bf16_serial(out16, out, static_cast<int64_t>(n));
}

// d gelu(x) / dx
inline float gelu_grad(float x) {
  const float th = tanh_approx(kS * (x + 0.044715f * x * x * x));
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kS * (1.0f + 3.0f * 0.044715f * x * x);
}

LOOM_VECTOR_CLONES void gelu_backward_chunk(float* dinp, const float* inp, const float* dout,
                                            size_t n, bool assign) {
  if (assign) {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) dinp[i] = gelu_grad(inp[i]) * dout[i];
    return;
  }
#pragma omp simd
  for (size_t i = 0; i < n; ++i) dinp[i] += gelu_grad(inp[i]) * dout[i];
}
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n, uint16_t* out16) {
  for_each_chunk(n, [&](size_t c, size_t k) {
    gelu_forward_chunk(out + c, out16 ? out16 + c : nullptr, inp + c, k);
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, bool assign) {
  for_each_chunk(
      n, [&](size_t c, size_t k) { gelu_backward_chunk(dinp + c, inp + c, dout + c, k, assign); });
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace loom::kernels::cpu
