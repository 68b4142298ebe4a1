// Token + position embedding. Backward scatters into the embedding tables (+=).
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                     int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const float* te = wte + static_cast<size_t>(tokens[b * T + t]) * C;
      const float* pe = wpe + static_cast<size_t>(t) * C;
      for (int i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
      float* dte = dwte + static_cast<size_t>(tokens[b * T + t]) * C;
      float* dpe = dwpe + static_cast<size_t>(t) * C;
      for (int i = 0; i < C; ++i) {
        dte[i] += d[i];
        dpe[i] += d[i];
      }
    }
}

}  // namespace loom::kernels::cpu
