// Token + position embedding. Backward scatters into the embedding tables (+=).
#include <algorithm>

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

void embedding_shard_forward(float* out, const int* tokens, const float* wte_shard, int vbegin,
                             int Vl, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<size_t>(n) * C;
    const int row = tokens[n] - vbegin;
    if (row >= 0 && row < Vl)
      std::copy(wte_shard + static_cast<size_t>(row) * C,
                wte_shard + static_cast<size_t>(row + 1) * C, o);
    else
      std::fill(o, o + C, 0.0f);
  }
}

// Serial: two rows of the same token add into one wte row (and the order of additions is
// the one-process order, row by row).
void embedding_shard_backward(float* dwte_shard, const float* dout, const int* tokens, int vbegin,
                              int Vl, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const int row = tokens[n] - vbegin;
    if (row < 0 || row >= Vl) continue;
    const float* d = dout + static_cast<size_t>(n) * C;
    float* dte = dwte_shard + static_cast<size_t>(row) * C;
    for (int i = 0; i < C; ++i) dte[i] += d[i];
  }
}

void position_forward(float* out, const float* wpe, int row_begin, int R, int T, int C) {
  for (int r = 0; r < R; ++r) {
    float* o = out + static_cast<size_t>(r) * C;
    const float* pe = wpe + static_cast<size_t>((row_begin + r) % T) * C;
    for (int i = 0; i < C; ++i) o[i] += pe[i];
  }
}

void position_backward(float* dwpe, const float* dout, int row_begin, int R, int T, int C) {
  for (int r = 0; r < R; ++r) {
    const float* d = dout + static_cast<size_t>(r) * C;
    float* dpe = dwpe + static_cast<size_t>((row_begin + r) % T) * C;
    for (int i = 0; i < C; ++i) dpe[i] += d[i];
  }
}

void embed_rows(float* out, const int* tokens, const int* positions, const float* wte,
                const float* wpe, int R, int C) {
#pragma omp parallel for if (R > 16)
  for (int r = 0; r < R; ++r) {
    float* o = out + static_cast<size_t>(r) * C;
    const float* te = wte + static_cast<size_t>(tokens[r]) * C;
    const float* pe = wpe + static_cast<size_t>(positions[r]) * C;
    for (int c = 0; c < C; ++c) o[c] = te[c] + pe[c];
  }
}

void kv_append(float* k, float* v, const float* qkv, const int* seq, const int* pos, int R, int C,
               int NH, int cap) {
  const int hs = C / NH;
#pragma omp parallel for if (R > 16)
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < NH; ++h) {
      const size_t at = ((static_cast<size_t>(seq[r]) * NH + h) * cap + pos[r]) * hs;
      const float* row = qkv + static_cast<size_t>(r) * 3 * C + static_cast<size_t>(h) * hs;
      std::copy(row + C, row + C + hs, k + at);
      std::copy(row + 2 * C, row + 2 * C + hs, v + at);
    }
}

}  // namespace loom::kernels::cpu
