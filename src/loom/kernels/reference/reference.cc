#include "loom/kernels/reference/reference.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace loom::kernels::reference {

float round_bf16(float x) {
  if (std::isnan(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);  // to nearest, ties to even
  u &= 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

namespace {
// An operand as a product reads it.
float operand(float x, bool bf16) {
  return bf16 ? round_bf16(x) : x;
}
}  // namespace

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                     int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int token = tokens[b * T + t];
      for (int i = 0; i < C; ++i)
        out[(static_cast<size_t>(b) * T + t) * C + i] =
            wte[static_cast<size_t>(token) * C + i] + wpe[static_cast<size_t>(t) * C + i];
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int token = tokens[b * T + t];
      for (int i = 0; i < C; ++i) {
        const float d = dout[(static_cast<size_t>(b) * T + t) * C + i];
        dwte[static_cast<size_t>(token) * C + i] += d;
        dwpe[static_cast<size_t>(t) * C + i] += d;
      }
    }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    double sum = 0;
    for (int i = 0; i < C; ++i) sum += x[i];
    const double m = sum / C;
    double var = 0;
    for (int i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + 1e-5);
    for (int i = 0; i < C; ++i)
      out[static_cast<size_t>(n) * C + i] =
          static_cast<float>((x[i] - m) * s * weight[i] + bias[i]);
    mean[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(s);
  }
}

void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* d = dout + static_cast<size_t>(n) * C;
    const double m = mean[n], s = rstd[n];
    double dnorm_mean = 0, dnorm_xhat_mean = 0;
    for (int i = 0; i < C; ++i) {
      const double xhat = (x[i] - m) * s;
      const double dnorm = static_cast<double>(d[i]) * weight[i];
      dnorm_mean += dnorm;
      dnorm_xhat_mean += dnorm * xhat;
    }
    dnorm_mean /= C;
    dnorm_xhat_mean /= C;
    for (int i = 0; i < C; ++i) {
      const double xhat = (x[i] - m) * s;
      const double dnorm = static_cast<double>(d[i]) * weight[i];
      dinp[static_cast<size_t>(n) * C + i] +=
          static_cast<float>(s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean));
    }
  }
}

void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C) {
  for (int i = 0; i < C; ++i) {
    double dw = 0, db = 0;
    for (int n = 0; n < N; ++n) {
      const double xhat =
          (inp[static_cast<size_t>(n) * C + i] - mean[n]) * static_cast<double>(rstd[n]);
      dw += xhat * dout[static_cast<size_t>(n) * C + i];
      db += dout[static_cast<size_t>(n) * C + i];
    }
    dweight[i] += static_cast<float>(dw);
    dbias[i] += static_cast<float>(db);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
  layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd, N, C);
}

namespace {
// x (n values) as a product reads them: rounded to bf16 when bf16.
std::vector<float> operands(const float* x, size_t n, bool bf16) {
  std::vector<float> r(x, x + n);
  for (float& v : r) v = operand(v, bf16);
  return r;
}
}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, bool bf16) {
  const auto x = operands(inp, static_cast<size_t>(N) * C, bf16);
  const auto w = operands(weight, static_cast<size_t>(OC) * C, bf16);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double sum = bias ? bias[o] : 0.0;
      for (int i = 0; i < C; ++i)
        sum += static_cast<double>(x[static_cast<size_t>(n) * C + i]) *
               w[static_cast<size_t>(o) * C + i];
      out[static_cast<size_t>(n) * OC + o] = static_cast<float>(sum);
    }
}

void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                           int OC, bool bf16) {
  const auto d = operands(dout, static_cast<size_t>(N) * OC, bf16);
  const auto w = operands(weight, static_cast<size_t>(OC) * C, bf16);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < C; ++i) {
      double sum = 0;
      for (int o = 0; o < OC; ++o)
        sum += static_cast<double>(d[static_cast<size_t>(n) * OC + o]) *
               w[static_cast<size_t>(o) * C + i];
      dinp[static_cast<size_t>(n) * C + i] += static_cast<float>(sum);
    }
}

void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                            int N, int C, int OC, bool bf16) {
  const auto d = operands(dout, static_cast<size_t>(N) * OC, bf16);
  const auto x = operands(inp, static_cast<size_t>(N) * C, bf16);
  for (int o = 0; o < OC; ++o) {
    for (int i = 0; i < C; ++i) {
      double sum = 0;
      for (int n = 0; n < N; ++n)
        sum += static_cast<double>(d[static_cast<size_t>(n) * OC + o]) *
               x[static_cast<size_t>(n) * C + i];
      dweight[static_cast<size_t>(o) * C + i] += static_cast<float>(sum);
    }
    if (dbias) {  // the bias's gradient reads dout unrounded (it is no product)
      double sum = 0;
      for (int n = 0; n < N; ++n) sum += dout[static_cast<size_t>(n) * OC + o];
      dbias[o] += static_cast<float>(sum);
    }
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, bool bf16) {
  matmul_backward_input(dinp, dout, weight, N, C, OC, bf16);
  matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC, bf16);
}

namespace {
// q, k or v (part 0, 1, 2) of head h at (b, t), element i, inside inp (B,T,3C).
size_t qkv_at(int b, int t, int part, int h, int i, int T, int C, int hs) {
  return (static_cast<size_t>(b) * T + t) * 3 * C + static_cast<size_t>(part) * C +
         static_cast<size_t>(h) * hs + i;
}
size_t att_at(int b, int h, int t, int t2, int NH, int T) {
  return ((static_cast<size_t>(b) * NH + h) * T + t) * T + t2;
}
}  // namespace

void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       bool bf16) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> pre(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < hs; ++i)
            dot += static_cast<double>(operand(inp[qkv_at(b, t, 0, h, i, T, C, hs)], bf16)) *
                   operand(inp[qkv_at(b, t2, 1, h, i, T, C, hs)], bf16);
          pre[t2] = static_cast<float>(dot * scale);  // the product's fp32 result
          maxv = std::max(maxv, pre[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(pre[t2] - maxv);
        for (int t2 = 0; t2 < T; ++t2)
          att[att_at(b, h, t, t2, NH, T)] =
              t2 <= t ? static_cast<float>(std::exp(pre[t2] - maxv) / sum) : 0.0f;
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int t2 = 0; t2 <= t; ++t2)
            o += static_cast<double>(operand(att[att_at(b, h, t, t2, NH, T)], bf16)) *
                 operand(inp[qkv_at(b, t2, 2, h, i, T, C, hs)], bf16);
          out[(static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs + i] =
              static_cast<float>(o);
        }
      }
}

void attention_backward(float* dinp, const float* dout, const float* inp, const float* att, int B,
                        int T, int C, int NH, bool bf16) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> datt(static_cast<size_t>(T)), dpre(static_cast<size_t>(T));
  auto g = [&](int b, int t, int h, int i) {  // dout of head h at (b, t), as products read it
    return operand(dout[(static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs + i],
                   bf16);
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        // datt[t2] = dout_t . v_t2;  dv_t2 += att[t][t2] dout_t
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < hs; ++i)
            dot += static_cast<double>(g(b, t, h, i)) *
                   operand(inp[qkv_at(b, t2, 2, h, i, T, C, hs)], bf16);
          datt[t2] = static_cast<float>(dot);
          const double a = operand(att[att_at(b, h, t, t2, NH, T)], bf16);
          for (int i = 0; i < hs; ++i)
            dinp[qkv_at(b, t2, 2, h, i, T, C, hs)] += static_cast<float>(a * g(b, t, h, i));
        }
        // softmax's backward: dpre = att * (datt - sum(att * datt)), times the scale
        double dot = 0;
        for (int t2 = 0; t2 <= t; ++t2) dot += att[att_at(b, h, t, t2, NH, T)] * datt[t2];
        for (int t2 = 0; t2 <= t; ++t2)
          dpre[t2] = operand(
              static_cast<float>(att[att_at(b, h, t, t2, NH, T)] * (datt[t2] - dot) * scale), bf16);
        // dq_t += sum dpre[t2] k_t2;  dk_t2 += dpre[t2] q_t
        for (int i = 0; i < hs; ++i) {
          double dq = 0;
          for (int t2 = 0; t2 <= t; ++t2)
            dq += dpre[t2] * operand(inp[qkv_at(b, t2, 1, h, i, T, C, hs)], bf16);
          dinp[qkv_at(b, t, 0, h, i, T, C, hs)] += static_cast<float>(dq);
          const double q = operand(inp[qkv_at(b, t, 0, h, i, T, C, hs)], bf16);
          for (int t2 = 0; t2 <= t; ++t2)
            dinp[qkv_at(b, t2, 1, h, i, T, C, hs)] += static_cast<float>(dpre[t2] * q);
        }
      }
}

namespace {
constexpr double kS = 0.7978845608028654;  // sqrt(2/pi)
}

void gelu_forward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(kS * (x + 0.044715 * x * x * x))));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double th = std::tanh(kS * (x + 0.044715 * x * x * x));
    const double grad =
        0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * kS * (1.0 + 3.0 * 0.044715 * x * x);
    dinp[i] += static_cast<float>(grad * dout[i]);
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

namespace {
// log(sum of e^l[i]) over the real vocabulary (i < V), shifted by the row's max.
double log_sum_exp(const float* l, int V) {
  double maxv = -INFINITY;
  for (int i = 0; i < V; ++i) maxv = std::max(maxv, static_cast<double>(l[i]));
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += std::exp(l[i] - maxv);
  return std::log(sum) + maxv;
}
}  // namespace

void crossentropy_forward(float* losses, const float* logits, const int* targets, int N, int V,
                          int Vp) {
  for (int n = 0; n < N; ++n) {
    const float* l = logits + static_cast<size_t>(n) * Vp;
    losses[n] = static_cast<float>(log_sum_exp(l, V) - l[targets[n]]);
  }
}

void crossentropy_backward(float* dlogits, const float* logits, const int* targets, float dloss,
                           int N, int V, int Vp) {
  for (int n = 0; n < N; ++n) {
    const float* l = logits + static_cast<size_t>(n) * Vp;
    float* d = dlogits + static_cast<size_t>(n) * Vp;
    const double lse = log_sum_exp(l, V);
    for (int i = 0; i < V; ++i) {
      const double p = std::exp(l[i] - lse), onehot = i == targets[n] ? 1.0 : 0.0;
      d[i] = static_cast<float>((p - onehot) * dloss);
    }
    for (int i = V; i < Vp; ++i) d[i] = 0.0f;
  }
}

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale) {
  const double c1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double c2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(grads[i]) * grad_scale;
    double p = params[i];
    p -= static_cast<double>(lr) * weight_decay * p;
    const double mi = beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * g;
    const double vi = beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * g * g;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    params[i] = static_cast<float>(p - lr * (mi / c1) / (std::sqrt(vi / c2) + eps));
  }
}

}  // namespace loom::kernels::reference
