// nn.Linear: out = inp @ weight^T + bias, the products through Gemm (oneDNN).
//   dinp    += dout @ weight          (N,OC)x(OC,C)
//   dweight += dout^T @ inp           (OC,N)x(N,C)
//   dbias   += column sums of dout
#include <algorithm>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

void matmul_forward(Gemm& gemm, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC, const uint16_t* weight16,
                    const uint16_t* inp16) {
  gemm.run({N, OC, C}, {inp, C, 1, 0, 0, inp16}, {weight, 1, C, 0, 0, weight16}, {out, OC, 1}, 1.0f,
           false, bias);
}

void bias_forward(float* out, const float* bias, int N, int OC) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) out[static_cast<size_t>(n) * OC + o] += bias[o];
}

void matmul_backward(Gemm& gemm, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC,
                     const uint16_t* weight16, const uint16_t* dout16, bool assign) {
  if (!dout16) dout16 = gemm.stage_bf16(dout, static_cast<int64_t>(N) * OC);
  matmul_backward_input(gemm, dinp, dout, weight, N, C, OC, weight16, dout16, assign);
  matmul_backward_weight(gemm, dweight, dbias, dout, inp, N, C, OC, dout16);
}

void matmul_backward_input(Gemm& gemm, float* dinp, const float* dout, const float* weight, int N,
                           int C, int OC, const uint16_t* weight16, const uint16_t* dout16,
                           bool assign) {
  gemm.run({N, C, OC}, {dout, OC, 1, 0, 0, dout16}, {weight, C, 1, 0, 0, weight16}, {dinp, C, 1},
           1.0f, !assign);
}

void matmul_backward_weight(Gemm& gemm, float* dweight, float* dbias, const float* dout,
                            const float* inp, int N, int C, int OC, const uint16_t* dout16) {
  gemm.run({OC, C, N}, {dout, 1, OC, 0, 0, dout16}, {inp, C, 1}, {dweight, C, 1}, 1.0f, true);
  if (!dbias) return;
  // Column sums: each thread sums a block of columns over all rows (rows are contiguous,
  // so a thread streams its column block row after row).
  constexpr int kBlock = 64;
#pragma omp parallel for
  for (int o0 = 0; o0 < OC; o0 += kBlock) {
    const int o1 = std::min(OC, o0 + kBlock);
    float acc[kBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* row = dout + static_cast<size_t>(n) * OC;
      for (int o = o0; o < o1; ++o) acc[o - o0] += row[o];
    }
    for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
  }
}

}  // namespace loom::kernels::cpu
