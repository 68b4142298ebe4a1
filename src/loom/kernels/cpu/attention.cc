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
// faster steps on gpt2-124m, T=1024, on a Zen 5 EPYC; the softmax stays fp32). Each operand
// is rounded once however many products read it, att and datt in the pass that makes them.
#include <cmath>

#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cpu/vecmath.h"

namespace loom::kernels::cpu {

namespace {
// Views of q, k or v (part 0, 1, 2) inside qkv (B,T,3C), and of a (B,T,C) tensor, as
// (b, h) batches of (T, hs) matrices, optionally transposed to (hs, T).
// x16, where given, is the whole tensor rounded to bf16 (the views' bf16 elements at the
// same offsets).
MatrixView qkv_view(const float* qkv, int part, int T, int C, int hs, bool transposed,
                    const uint16_t* qkv16 = nullptr) {
  const int64_t C3 = 3LL * C, off = static_cast<int64_t>(part) * C;
  const float* base = qkv + off;
  const uint16_t* base16 = qkv16 ? qkv16 + off : nullptr;
  return transposed ? MatrixView{base, 1, C3, T * C3, hs, base16}
                    : MatrixView{base, C3, 1, T * C3, hs, base16};
}
MatrixView btc_view(const float* x, int T, int C, int hs, const uint16_t* x16 = nullptr) {
  return {x, C, 1, static_cast<int64_t>(T) * C, hs, x16};
}
// (b, h) batches of (T, T) matrices, dense, optionally transposed.
MatrixView tt_view(const float* x, int T, int NH, bool transposed, const uint16_t* x16 = nullptr) {
  const int64_t TT = static_cast<int64_t>(T) * T;
  return transposed ? MatrixView{x, 1, T, NH * TT, TT, x16} : MatrixView{x, T, 1, NH * TT, TT, x16};
}

// a (n) = softmax(a), vectorised (exp_approx): the causal row's visible part in the forward
// and a decoded row's: the same arithmetic for both.
LOOM_VECTOR_CLONES void softmax_prefix(float* a, int n) {
  float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
  for (int j = 0; j < n; ++j) maxv = a[j] > maxv ? a[j] : maxv;
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    a[j] = exp_approx(a[j] - maxv);
    sum += a[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < n; ++j) a[j] *= inv;
}

// d (n) = a * (d - sum(a * d)) * scale: softmax's backward on the causal row's visible part,
// in place, vectorised.
LOOM_VECTOR_CLONES void softmax_grad_prefix(float* d, const float* a, int n, float scale) {
  float dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < n; ++j) dot += a[j] * d[j];
#pragma omp simd
  for (int j = 0; j < n; ++j) d[j] = a[j] * (d[j] - dot) * scale;
}

// Staging slots of the Gemm for attention's bf16 roundings (slot 0 stays the callers').
constexpr int kQkvSlot = 1, kTTSlot = 2, kDoutSlot = 3;
}  // namespace

void attention_forward(Gemm& gemm, float* out, float* att, const float* inp, int B, int T, int C,
                       int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // bf16 products: q, k and v rounded once for the three views, att in the softmax's pass.
  const int64_t TT = static_cast<int64_t>(T) * T;
  const uint16_t* qkv16 = gemm.stage_bf16(inp, int64_t{B} * T * 3 * C, kQkvSlot);
  uint16_t* att16 = gemm.staging_bf16(int64_t{B} * NH * TT, kTTSlot);
  gemm.run({T, T, hs, B, NH}, qkv_view(inp, 0, T, C, hs, false, qkv16),
           qkv_view(inp, 1, T, C, hs, true, qkv16), tt_view(att, T, NH, false), scale, false);
#pragma omp parallel for collapse(2)
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      const size_t row = (static_cast<size_t>(bh) * T + t) * T;
      float* a = att + row;
      softmax_prefix(a, t + 1);
      for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0;
      if (att16) round_to_bf16_serial(att16 + row, a, T);
    }
  gemm.run({T, hs, T, B, NH}, tt_view(att, T, NH, false, att16),
           qkv_view(inp, 2, T, C, hs, false, qkv16), btc_view(out, T, C, hs), 1.0f, false);
}

void attention_backward(Gemm& gemm, float* dinp, float* scratch, const float* dout,
                        const float* inp, const float* att, int B, int T, int C, int NH,
                        bool assign) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool acc = !assign;  // dq, dk and dv each get one product
  float* datt = scratch;
  // bf16 products: q, k, v and dout rounded once each, though each is read by two products;
  // datt rounded in the pass that makes it (att is rounded again: it is kept in fp32 only).
  const int64_t TT = static_cast<int64_t>(T) * T;
  const uint16_t* qkv16 = gemm.stage_bf16(inp, int64_t{B} * T * 3 * C, kQkvSlot);
  const uint16_t* dout16 = gemm.stage_bf16(dout, int64_t{B} * T * C, kDoutSlot);
  gemm.run({T, T, hs, B, NH}, btc_view(dout, T, C, hs, dout16),
           qkv_view(inp, 2, T, C, hs, true, qkv16), tt_view(datt, T, NH, false), 1.0f, false);
  gemm.run({T, hs, T, B, NH}, tt_view(att, T, NH, true), btc_view(dout, T, C, hs, dout16),
           qkv_view(dinp, 2, T, C, hs, false), 1.0f, acc);
  uint16_t* datt16 = gemm.staging_bf16(int64_t{B} * NH * TT, kTTSlot);
#pragma omp parallel for collapse(2)
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      const size_t row = (static_cast<size_t>(bh) * T + t) * T;
      float* d = datt + row;  // becomes dpreatt * scale in place
      softmax_grad_prefix(d, att + row, t + 1, scale);
      for (int t2 = t + 1; t2 < T; ++t2) d[t2] = 0;
      if (datt16) round_to_bf16_serial(datt16 + row, d, T);
    }
  gemm.run({T, hs, T, B, NH}, tt_view(datt, T, NH, false, datt16),
           qkv_view(inp, 1, T, C, hs, false, qkv16), qkv_view(dinp, 0, T, C, hs, false), 1.0f, acc);
  gemm.run({T, hs, T, B, NH}, tt_view(datt, T, NH, true, datt16),
           qkv_view(inp, 0, T, C, hs, false, qkv16), qkv_view(dinp, 1, T, C, hs, false), 1.0f, acc);
}

namespace {
// One (row, head): a (n) = softmax(q . K[j] * scale) over j < n, out (hs) = sum_j a[j] V[j],
// the softmax attention_forward's.
LOOM_VECTOR_CLONES void decode_head(float* out, float* a, const float* q, const float* K,
                                    const float* V, int n, int hs, float scale) {
  for (int j = 0; j < n; ++j) {
    const float* kj = K + static_cast<size_t>(j) * hs;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < hs; ++i) dot += q[i] * kj[i];
    a[j] = dot * scale;
  }
  softmax_prefix(a, n);
  for (int i = 0; i < hs; ++i) out[i] = 0;
  for (int j = 0; j < n; ++j) {
    const float aj = a[j];
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
