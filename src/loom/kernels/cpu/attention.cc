// Causal multi-head self-attention (GPT-2), hs = C / NH, scale = 1/sqrt(hs), per (b, h):
//   att = softmax(Q K^T * scale) over t2 <= t, zero for t2 > t      (T,T)
//   out = att V                                                      (T,hs)
// Both products, and the four of the backward pass, are batched GEMMs over (b, h) reading
// Q, K, V and writing dQ, dK, dV in place inside the (B,T,3C) qkv layout by strides; the
// causal half above the diagonal is computed and masked (twice the minimal FLOPs, but at
// GEMM speed, ~20x the direct loops here). Backward:
//   datt = dout V^T;  dV += att^T dout;  dpre = att * (datt - rowsum(att * datt)) * scale;
//   dQ += dpre K;     dK += dpre^T Q.
// In bf16 mode these products read bf16 operands too, as PyTorch's autocast runs them (2%
// faster steps on gpt2-124m, T=1024, on a Zen 5 EPYC; the softmax stays fp32).
#include <cmath>

#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {

namespace {
// Views of q, k or v (part 0, 1, 2) inside qkv (B,T,3C), and of a (B,T,C) tensor, as
// (b, h) batches of (T, hs) matrices, optionally transposed to (hs, T).
MatrixView qkv_view(const float* qkv, int part, int T, int C, int hs, bool transposed) {
  const int64_t C3 = 3LL * C;
  const float* base = qkv + static_cast<int64_t>(part) * C;
  return transposed ? MatrixView{base, 1, C3, T * C3, hs} : MatrixView{base, C3, 1, T * C3, hs};
}
MatrixView btc_view(const float* x, int T, int C, int hs) {
  return {x, C, 1, static_cast<int64_t>(T) * C, hs};
}
// (b, h) batches of (T, T) matrices, dense, optionally transposed.
MatrixView tt_view(const float* x, int T, int NH, bool transposed) {
  const int64_t TT = static_cast<int64_t>(T) * T;
  return transposed ? MatrixView{x, 1, T, NH * TT, TT} : MatrixView{x, T, 1, NH * TT, TT};
}
}  // namespace

void attention_forward(Gemm& gemm, float* out, float* att, const float* inp, int B, int T, int C,
                       int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  gemm.run({T, T, hs, B, NH}, qkv_view(inp, 0, T, C, hs, false), qkv_view(inp, 1, T, C, hs, true),
           tt_view(att, T, NH, false), scale, false);
#pragma omp parallel for collapse(2)
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      float* a = att + (static_cast<size_t>(bh) * T + t) * T;
      float maxv = -INFINITY;
      for (int t2 = 0; t2 <= t; ++t2) maxv = std::max(maxv, a[t2]);
      float sum = 0;
      for (int t2 = 0; t2 <= t; ++t2) {
        a[t2] = std::exp(a[t2] - maxv);
        sum += a[t2];
      }
      const float inv = 1.0f / sum;
      for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
      for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0;
    }
  gemm.run({T, hs, T, B, NH}, tt_view(att, T, NH, false), qkv_view(inp, 2, T, C, hs, false),
           btc_view(out, T, C, hs), 1.0f, false);
}

void attention_backward(Gemm& gemm, float* dinp, float* scratch, const float* dout,
                        const float* inp, const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* datt = scratch;
  gemm.run({T, T, hs, B, NH}, btc_view(dout, T, C, hs), qkv_view(inp, 2, T, C, hs, true),
           tt_view(datt, T, NH, false), 1.0f, false);
  gemm.run({T, hs, T, B, NH}, tt_view(att, T, NH, true), btc_view(dout, T, C, hs),
           qkv_view(dinp, 2, T, C, hs, false), 1.0f, true);
#pragma omp parallel for collapse(2)
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      const size_t row = (static_cast<size_t>(bh) * T + t) * T;
      const float* a = att + row;
      float* d = datt + row;  // becomes dpreatt * scale in place
      float dot = 0;
      for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * d[t2];
      for (int t2 = 0; t2 <= t; ++t2) d[t2] = a[t2] * (d[t2] - dot) * scale;
      for (int t2 = t + 1; t2 < T; ++t2) d[t2] = 0;
    }
  gemm.run({T, hs, T, B, NH}, tt_view(datt, T, NH, false), qkv_view(inp, 1, T, C, hs, false),
           qkv_view(dinp, 0, T, C, hs, false), 1.0f, true);
  gemm.run({T, hs, T, B, NH}, tt_view(datt, T, NH, true), qkv_view(inp, 0, T, C, hs, false),
           qkv_view(dinp, 1, T, C, hs, false), 1.0f, true);
}

namespace {
// One (row, head): a (n) = softmax(q . K[j] * scale) over j < n, out (hs) = sum_j a[j] V[j],
// the softmax written as attention_forward's (max, exp, sum, scale by 1/sum).
LOOM_VECTOR_CLONES void decode_head(float* out, float* a, const float* q, const float* K,
                                    const float* V, int n, int hs, float scale) {
  float maxv = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const float* kj = K + static_cast<size_t>(j) * hs;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < hs; ++i) dot += q[i] * kj[i];
    a[j] = dot * scale;
    maxv = std::max(maxv, a[j]);
  }
  float sum = 0;
  for (int j = 0; j < n; ++j) sum += a[j] = std::exp(a[j] - maxv);
  const float inv = 1.0f / sum;
  for (int i = 0; i < hs; ++i) out[i] = 0;
  for (int j = 0; j < n; ++j) {
    const float aj = a[j] * inv;
    const float* vj = V + static_cast<size_t>(j) * hs;
#pragma omp simd
    for (int i = 0; i < hs; ++i) out[i] += aj * vj[i];
  }
}
}  // namespace

void attention_decode(float* out, float* scratch, const float* qkv, const float* const* k,
                      const float* const* v, const int* len, int R, int C, int NH, int cap) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2)
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < NH; ++h) {
      const size_t head = static_cast<size_t>(h) * cap * hs;
      decode_head(out + static_cast<size_t>(r) * C + h * hs,
                  scratch + (static_cast<size_t>(r) * NH + h) * cap,
                  qkv + static_cast<size_t>(r) * 3 * C + h * hs, k[r] + head, v[r] + head, len[r],
                  hs, scale);
    }
}

}  // namespace loom::kernels::cpu
