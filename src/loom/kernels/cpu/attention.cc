// Causal multi-head self-attention (GPT-2), hs = C / NH, scale = 1/sqrt(hs):
//   preatt[t][t2] = q_t . k_t2 * scale    for t2 <= t
//   att[t]        = softmax(preatt[t][0..t]), zero for t2 > t
//   out_t         = sum_{t2<=t} att[t][t2] v_t2
// Backward walks the same three steps in reverse; datt and dpreatt are accumulators the
// caller zeroes like every other gradient.
#include <cmath>

#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

void attention_forward(float* out, float* preatt, float* att, const float* inp, int B, int T, int C,
                       int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = static_cast<size_t>(C) * 3;
#pragma omp parallel for collapse(3)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        const float* q = inp + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        float* pre = preatt + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = inp + (static_cast<size_t>(b) * T + t2) * C3 + C + h * hs;
          float dot = 0;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          pre[t2] = dot;
          if (dot > maxv) maxv = dot;
        }
        float sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          float e = std::exp(pre[t2] - maxv);
          a[t2] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 < T; ++t2) {
          if (t2 <= t) {
            a[t2] *= inv;
          } else {
            a[t2] = 0;
            pre[t2] = 0;
          }
        }
        float* o = out + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = inp + (static_cast<size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
          for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
}

void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                        const float* inp, const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = static_cast<size_t>(C) * 3;
  // (b, h) pairs touch disjoint parts of dinp; within one, t runs serially because the
  // k and v gradients of earlier positions accumulate from every later t.
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const size_t row = ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        const float* a = att + row;
        float* da = datt + row;
        float* dpre = dpreatt + row;
        const float* q = inp + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        float* dq = dinp + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        const float* d = dout + (static_cast<size_t>(b) * T + t) * C + h * hs;
        // out = att @ v
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = inp + (static_cast<size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
          float* dv = dinp + (static_cast<size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
          for (int i = 0; i < hs; ++i) {
            da[t2] += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
        }
        // softmax: dpre = att * (datt - sum(att * datt))
        float dot = 0;
        for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * da[t2];
        for (int t2 = 0; t2 <= t; ++t2) dpre[t2] += a[t2] * (da[t2] - dot);
        // preatt = q . k * scale
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = inp + (static_cast<size_t>(b) * T + t2) * C3 + C + h * hs;
          float* dk = dinp + (static_cast<size_t>(b) * T + t2) * C3 + C + h * hs;
          for (int i = 0; i < hs; ++i) {
            dq[i] += k[i] * dpre[t2] * scale;
            dk[i] += q[i] * dpre[t2] * scale;
          }
        }
      }
}

}  // namespace loom::kernels::cpu
