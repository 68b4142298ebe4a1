// nn.Linear: out = inp @ weight^T + bias, through BLAS sgemm (OpenBLAS).
//   dinp    += dout @ weight          (N,OC)x(OC,C)
//   dweight += dout^T @ inp           (OC,N)x(N,C)
//   dbias   += column sums of dout
#include <cblas.h>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out,
              OC);
  if (!bias) return;
#pragma omp parallel for
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) out[static_cast<size_t>(n) * OC + o] += bias[o];
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f,
              dinp, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (!dbias) return;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) dbias[o] += dout[static_cast<size_t>(n) * OC + o];
}

}  // namespace loom::kernels::cpu
