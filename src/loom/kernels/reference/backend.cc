// The reference backend: reference.h's kernels, and the few the model needs beyond them
// (vocabulary shards, positions for a range of rows, the fused and in-place forms, decoding)
// written here as plain loops in the same style. It never reads caller-made bf16 copies
// (reads_bf16() is false): every product rounds its own operands, so its bf16 numbers
// follow from the fp32 ones and the rounding rule alone. Slow by design.
#include "loom/kernels/reference/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/kernels/reference/reference.h"

namespace loom::kernels::reference {
namespace {

uint16_t bf16_bits(float x) {
  const float r = round_bf16(x);
  uint32_t u;
  std::memcpy(&u, &r, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

void write_bf16(uint16_t* out16, const float* x, size_t n) {
  if (out16)
    for (size_t i = 0; i < n; ++i) out16[i] = bf16_bits(x[i]);
}

void zero(float* x, size_t n) {
  std::fill(x, x + n, 0.0f);
}

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(Precision p) : precision_(p) {}
  const char* name() const override { return "reference"; }
  std::shared_ptr<Memory> memory() const override { return host_memory(); }

  Precision precision() const override { return precision_; }
  void set_precision(Precision p) override { precision_ = p; }
  bool reads_bf16() const override { return false; }
  uint16_t* staging_bf16(int64_t /*n*/, int /*slot*/) override { return nullptr; }
  void set_staging(bool /*on*/) override {}
  void round_to_bf16(uint16_t* out, const float* x, int64_t n) override {
    write_bf16(out, x, static_cast<size_t>(n));
  }

  void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    reference::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B,
                        int T, int C) override {
    reference::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  // out (N,C) = wte_shard[token - vbegin] where the shard holds the token, else 0.
  void embedding_shard_forward(float* out, const int* tokens, const float* wte_shard, int vbegin,
                               int Vl, int N, int C) override {
    for (int n = 0; n < N; ++n) {
      const int row = tokens[n] - vbegin;
      for (int i = 0; i < C; ++i)
        out[static_cast<size_t>(n) * C + i] =
            row >= 0 && row < Vl ? wte_shard[static_cast<size_t>(row) * C + i] : 0.0f;
    }
  }
  void embedding_shard_backward(float* dwte_shard, const float* dout, const int* tokens, int vbegin,
                                int Vl, int N, int C) override {
    for (int n = 0; n < N; ++n) {
      const int row = tokens[n] - vbegin;
      if (row < 0 || row >= Vl) continue;
      for (int i = 0; i < C; ++i)
        dwte_shard[static_cast<size_t>(row) * C + i] += dout[static_cast<size_t>(n) * C + i];
    }
  }
  // Row r of the R rows is token row row_begin + r, at position (row_begin + r) mod T.
  void position_forward(float* out, const float* wpe, int row_begin, int R, int T, int C) override {
    for (int r = 0; r < R; ++r) {
      const int t = (row_begin + r) % T;
      for (int i = 0; i < C; ++i)
        out[static_cast<size_t>(r) * C + i] += wpe[static_cast<size_t>(t) * C + i];
    }
  }
  void position_backward(float* dwpe, const float* dout, int row_begin, int R, int T,
                         int C) override {
    for (int r = 0; r < R; ++r) {
      const int t = (row_begin + r) % T;
      for (int i = 0; i < C; ++i)
        dwpe[static_cast<size_t>(t) * C + i] += dout[static_cast<size_t>(r) * C + i];
    }
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C,
                         uint16_t* out16) override {
    reference::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    write_bf16(out16, out, static_cast<size_t>(N) * C);
  }
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* weight, const float* bias, int N,
                                  int C, uint16_t* out16) override {
    reference::residual_forward(res, a, b, static_cast<size_t>(N) * C);
    layernorm_forward(out, mean, rstd, res, weight, bias, N, C, out16);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    reference::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                const float* weight, const float* mean, const float* rstd, int N,
                                int C) override {
    reference::layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int N, int C) override {
    reference::layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd, N, C);
  }

  // The bf16 copies (weight16, inp16, dout16) hold the same values rounded; the reference
  // rounds the fp32 operands itself.
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC, const uint16_t* /*weight16*/,
                      const uint16_t* /*inp16*/) override {
    reference::matmul_forward(out, inp, weight, bias, N, C, OC, bf16());
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC,
                       const uint16_t* weight16, const uint16_t* dout16, bool assign) override {
    matmul_backward_input(dinp, dout, weight, N, C, OC, weight16, dout16, assign);
    matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC, dout16);
  }
  void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                             int OC, const uint16_t* /*weight16*/, const uint16_t* /*dout16*/,
                             bool assign) override {
    if (assign) zero(dinp, static_cast<size_t>(N) * C);
    reference::matmul_backward_input(dinp, dout, weight, N, C, OC, bf16());
  }
  void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                              int N, int C, int OC, const uint16_t* /*dout16*/) override {
    reference::matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC, bf16());
  }
  // The linear's forward in fp32 whatever the precision (decoding reads fp32 weights).
  void matmul_forward_rows(float* out, const float* inp, const float* weight, const float* bias,
                           int R, int C, int OC) override {
    reference::matmul_forward(out, inp, weight, bias, R, C, OC, /*bf16=*/false);
  }
  // fp32 inputs, bf16 weights widened exactly, sums in double.
  void matmul_forward_rows_bf16(float* out, const float* inp, const uint16_t* weight,
                                const float* bias, int R, int C, int OC) override {
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < OC; ++o) {
        double sum = bias ? bias[o] : 0.0;
        for (int i = 0; i < C; ++i)
          sum += static_cast<double>(inp[static_cast<size_t>(r) * C + i]) *
                 bf16_to_f32(weight[static_cast<size_t>(o) * C + i]);
        out[static_cast<size_t>(r) * OC + o] = static_cast<float>(sum);
      }
  }
  void bias_forward(float* out, const float* bias, int N, int OC) override {
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) out[static_cast<size_t>(n) * OC + o] += bias[o];
  }

  void attention_forward(float* out, float* att, const float* inp, int B, int T, int C,
                         int NH) override {
    reference::attention_forward(out, att, inp, B, T, C, NH, bf16());
  }
  void attention_backward(float* dinp, float* /*scratch*/, const float* dout, const float* inp,
                          const float* att, int B, int T, int C, int NH, bool assign) override {
    if (assign) zero(dinp, static_cast<size_t>(B) * T * 3 * C);
    reference::attention_backward(dinp, dout, inp, att, B, T, C, NH, bf16());
  }
  void embed_rows(float* out, const int* tokens, const int* positions, const float* wte,
                  const float* wpe, int R, int C) override {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        out[r * C + c] = wte[static_cast<size_t>(tokens[r]) * C + c] +
                         wpe[static_cast<size_t>(positions[r]) * C + c];
  }
  // Element by element: key i of head h of row r is qkv[r][C + h*hs + i].
  void kv_append(float* k, float* v, const float* qkv, const int* seq, const int* pos, int R, int C,
                 int NH, int cap) override {
    const int hs = C / NH;
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < hs; ++i) {
          const size_t at = ((static_cast<size_t>(seq[r]) * NH + h) * cap + pos[r]) * hs + i;
          k[at] = qkv[static_cast<size_t>(r) * 3 * C + C + h * hs + i];
          v[at] = qkv[static_cast<size_t>(r) * 3 * C + 2 * C + h * hs + i];
        }
  }
  // Row r's query (head h: qkv[r][h*hs ..]) over positions [0, len[r]) of k[r], v[r]
  // (NH, cap, hs); fp32 operands as the fast decode, the probabilities left in scratch.
  void attention_decode(float* out, float* scratch, const float* qkv, const float* const* k,
                        const float* const* v, const int* len, int R, int C, int NH,
                        int cap) override {
    const int hs = C / NH;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < NH; ++h) {
        const float* q = qkv + static_cast<size_t>(r) * 3 * C + static_cast<size_t>(h) * hs;
        const float* kh = k[r] + static_cast<size_t>(h) * cap * hs;
        const float* vh = v[r] + static_cast<size_t>(h) * cap * hs;
        float* p = scratch + (static_cast<size_t>(r) * NH + h) * cap;
        double maxv = -INFINITY;
        std::vector<double> pre(static_cast<size_t>(len[r]));
        for (int t = 0; t < len[r]; ++t) {
          double dot = 0;
          for (int i = 0; i < hs; ++i)
            dot += static_cast<double>(q[i]) * kh[static_cast<size_t>(t) * hs + i];
          pre[t] = dot * scale;
          maxv = std::max(maxv, pre[t]);
        }
        double sum = 0;
        for (int t = 0; t < len[r]; ++t) sum += std::exp(pre[t] - maxv);
        for (int t = 0; t < len[r]; ++t) p[t] = static_cast<float>(std::exp(pre[t] - maxv) / sum);
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int t = 0; t < len[r]; ++t)
            o += static_cast<double>(p[t]) * vh[static_cast<size_t>(t) * hs + i];
          out[static_cast<size_t>(r) * C + static_cast<size_t>(h) * hs + i] = static_cast<float>(o);
        }
      }
  }

  void gelu_forward(float* out, const float* inp, size_t n, uint16_t* out16) override {
    reference::gelu_forward(out, inp, n);
    write_bf16(out16, out, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                     bool assign) override {
    if (assign) zero(dinp, n);
    reference::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    reference::residual_forward(out, a, b, n);
  }
  void residual_backward(float* da, float* db, const float* dout, size_t n) override {
    reference::residual_backward(da, db, dout, n);
  }

  // The losses, and each row's max and sum of e^(l - max) over the real vocabulary (what the
  // fast backward reads; the reference's backward recomputes them from the logits).
  void crossentropy_forward(float* losses, float* row_max, float* row_sum, const float* logits,
                            const int* targets, int N, int V, int Vp) override {
    reference::crossentropy_forward(losses, logits, targets, N, V, Vp);
    for (int n = 0; n < N; ++n) {
      const float* l = logits + static_cast<size_t>(n) * Vp;
      const float m = *std::max_element(l, l + V);
      double sum = 0;
      for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(l[i]) - m);
      row_max[n] = m;
      row_sum[n] = static_cast<float>(sum);
    }
  }
  void crossentropy_backward_inplace(float* logits, uint16_t* dlogits16, const float* /*row_max*/,
                                     const float* /*row_sum*/, float dloss, const int* targets,
                                     int N, int V, int Vp) override {
    const size_t n = static_cast<size_t>(N) * Vp;
    std::vector<float> d(n);
    reference::crossentropy_backward(d.data(), logits, targets, dloss, N, V, Vp);
    std::copy(d.begin(), d.end(), logits);
    write_bf16(dlogits16, logits, n);
  }
  void logits_shard_max(float* maxv, const float* logits, int N, int Vl, int valid) override {
    for (int n = 0; n < N; ++n) {
      float m = -INFINITY;
      for (int i = 0; i < valid; ++i) m = std::max(m, logits[static_cast<size_t>(n) * Vl + i]);
      maxv[n] = m;
    }
  }
  void logits_shard_target(float* picked, const float* logits, const int* targets, int N, int Vl,
                           int vbegin, int valid) override {
    for (int n = 0; n < N; ++n) {
      const int i = targets[n] - vbegin;
      picked[n] = i >= 0 && i < valid ? logits[static_cast<size_t>(n) * Vl + i] : 0.0f;
    }
  }
  void softmax_shard_exp(float* logits, float* sums, const float* maxv, int N, int Vl,
                         int valid) override {
    for (int n = 0; n < N; ++n) {
      float* l = logits + static_cast<size_t>(n) * Vl;
      double sum = 0;
      for (int i = 0; i < Vl; ++i) {
        l[i] = i < valid ? static_cast<float>(std::exp(static_cast<double>(l[i]) - maxv[n])) : 0.0f;
        sum += l[i];
      }
      sums[n] = static_cast<float>(sum);
    }
  }
  void softmax_shard_scale(float* probs, const float* sums, int N, int Vl, int valid) override {
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < valid; ++i)
        probs[static_cast<size_t>(n) * Vl + i] = static_cast<float>(
            probs[static_cast<size_t>(n) * Vl + i] / static_cast<double>(sums[n]));
  }
  void crossentropy_shard_backward_inplace(float* probs, float dloss, const int* targets, int N,
                                           int Vl, int vbegin, int valid) override {
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < valid; ++i) {
        const double onehot = vbegin + i == targets[n] ? 1.0 : 0.0;
        float& p = probs[static_cast<size_t>(n) * Vl + i];
        p = static_cast<float>((p - onehot) * dloss);
      }
  }

  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override {
    reference::adamw_update(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                            grad_scale);
  }

 private:
  bool bf16() const { return precision_ == Precision::kBF16; }
  Precision precision_;
};

}  // namespace

std::unique_ptr<Backend> make_backend(Precision p) {
  return std::make_unique<ReferenceBackend>(p);
}

}  // namespace loom::kernels::reference
