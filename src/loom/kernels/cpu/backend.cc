// Each kernel forwards to kernels.h's, handing the products this backend's Gemm (its
// oneDNN primitives, precision and bf16 staging buffers).
#include "loom/kernels/cpu/backend.h"

#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Precision p) : gemm_(p) {}
  const char* name() const override { return "cpu"; }
  std::shared_ptr<Memory> memory() const override { return host_memory(); }

  Precision precision() const override { return gemm_.precision(); }
  void set_precision(Precision p) override { gemm_.set_precision(p); }
  bool reads_bf16() const override { return gemm_.reads_bf16(); }
  uint16_t* staging_bf16(int64_t n, int slot) override { return gemm_.staging_bf16(n, slot); }
  void set_staging(bool on) override { gemm_.set_staging(on); }
  void round_to_bf16(uint16_t* out, const float* x, int64_t n) override {
    cpu::round_to_bf16(out, x, n);
  }

  void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    cpu::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B,
                        int T, int C) override {
    cpu::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void embedding_shard_forward(float* out, const int* tokens, const float* wte_shard, int vbegin,
                               int Vl, int N, int C) override {
    cpu::embedding_shard_forward(out, tokens, wte_shard, vbegin, Vl, N, C);
  }
  void embedding_shard_backward(float* dwte_shard, const float* dout, const int* tokens, int vbegin,
                                int Vl, int N, int C) override {
    cpu::embedding_shard_backward(dwte_shard, dout, tokens, vbegin, Vl, N, C);
  }
  void position_forward(float* out, const float* wpe, int row_begin, int R, int T, int C) override {
    cpu::position_forward(out, wpe, row_begin, R, T, C);
  }
  void position_backward(float* dwpe, const float* dout, int row_begin, int R, int T,
                         int C) override {
    cpu::position_backward(dwpe, dout, row_begin, R, T, C);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C,
                         uint16_t* out16) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, out16);
  }
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* weight, const float* bias, int N,
                                  int C, uint16_t* out16) override {
    cpu::residual_layernorm_forward(res, out, mean, rstd, a, b, weight, bias, N, C, out16);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                const float* weight, const float* mean, const float* rstd, int N,
                                int C) override {
    cpu::layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int N, int C) override {
    cpu::layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd, N, C);
  }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC, const uint16_t* weight16, const uint16_t* inp16) override {
    cpu::matmul_forward(gemm_, out, inp, weight, bias, N, C, OC, weight16, inp16);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC,
                       const uint16_t* weight16, const uint16_t* dout16, bool assign) override {
    cpu::matmul_backward(gemm_, dinp, dweight, dbias, dout, inp, weight, N, C, OC, weight16, dout16,
                         assign);
  }
  void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                             int OC, const uint16_t* weight16, const uint16_t* dout16,
                             bool assign) override {
    cpu::matmul_backward_input(gemm_, dinp, dout, weight, N, C, OC, weight16, dout16, assign);
  }
  void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                              int N, int C, int OC, const uint16_t* dout16) override {
    cpu::matmul_backward_weight(gemm_, dweight, dbias, dout, inp, N, C, OC, dout16);
  }
  void matmul_forward_rows(float* out, const float* inp, const float* weight, const float* bias,
                           int R, int C, int OC) override {
    cpu::matmul_forward_rows(out, inp, weight, bias, R, C, OC);
  }
  void matmul_forward_rows_bf16(float* out, const float* inp, const uint16_t* weight,
                                const float* bias, int R, int C, int OC) override {
    cpu::matmul_forward_rows_bf16(out, inp, weight, bias, R, C, OC);
  }
  void bias_forward(float* out, const float* bias, int N, int OC) override {
    cpu::bias_forward(out, bias, N, OC);
  }

  void attention_forward(float* out, float* att, const float* inp, int B, int T, int C,
                         int NH) override {
    cpu::attention_forward(gemm_, out, att, inp, B, T, C, NH);
  }
  void attention_backward(float* dinp, float* scratch, const float* dout, const float* inp,
                          const float* att, int B, int T, int C, int NH, bool assign) override {
    cpu::attention_backward(gemm_, dinp, scratch, dout, inp, att, B, T, C, NH, assign);
  }
  void embed_rows(float* out, const int* tokens, const int* positions, const float* wte,
                  const float* wpe, int R, int C) override {
    cpu::embed_rows(out, tokens, positions, wte, wpe, R, C);
  }
  void kv_append(float* k, float* v, const float* qkv, const int* seq, const int* pos, int R, int C,
                 int NH, int cap) override {
    cpu::kv_append(k, v, qkv, seq, pos, R, C, NH, cap);
  }
  void attention_decode(float* out, float* scratch, const float* qkv, const float* const* k,
                        const float* const* v, const int* len, int R, int C, int NH,
                        int cap) override {
    cpu::attention_decode(out, scratch, qkv, k, v, len, R, C, NH, cap);
  }

  void gelu_forward(float* out, const float* inp, size_t n, uint16_t* out16) override {
    cpu::gelu_forward(out, inp, n, out16);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                     bool assign) override {
    cpu::gelu_backward(dinp, inp, dout, n, assign);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    cpu::residual_forward(out, a, b, n);
  }
  void residual_backward(float* da, float* db, const float* dout, size_t n) override {
    cpu::residual_backward(da, db, dout, n);
  }

  void crossentropy_forward(float* losses, float* row_max, float* row_sum, const float* logits,
                            const int* targets, int N, int V, int Vp) override {
    cpu::crossentropy_forward(losses, row_max, row_sum, logits, targets, N, V, Vp);
  }
  void crossentropy_backward_inplace(float* logits, uint16_t* dlogits16, const float* row_max,
                                     const float* row_sum, float dloss, const int* targets, int N,
                                     int V, int Vp) override {
    cpu::crossentropy_backward_inplace(logits, dlogits16, row_max, row_sum, dloss, targets, N, V,
                                       Vp);
  }
  void logits_shard_max(float* maxv, const float* logits, int N, int Vl, int valid) override {
    cpu::logits_shard_max(maxv, logits, N, Vl, valid);
  }
  void logits_shard_target(float* picked, const float* logits, const int* targets, int N, int Vl,
                           int vbegin, int valid) override {
    cpu::logits_shard_target(picked, logits, targets, N, Vl, vbegin, valid);
  }
  void softmax_shard_exp(float* logits, float* sums, const float* maxv, int N, int Vl,
                         int valid) override {
    cpu::softmax_shard_exp(logits, sums, maxv, N, Vl, valid);
  }
  void softmax_shard_scale(float* probs, const float* sums, int N, int Vl, int valid) override {
    cpu::softmax_shard_scale(probs, sums, N, Vl, valid);
  }
  void crossentropy_shard_backward_inplace(float* probs, float dloss, const int* targets, int N,
                                           int Vl, int vbegin, int valid) override {
    cpu::crossentropy_shard_backward_inplace(probs, dloss, targets, N, Vl, vbegin, valid);
  }

  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override {
    cpu::adamw_update(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  }

 private:
  Gemm gemm_;
};

}  // namespace

std::unique_ptr<Backend> make_backend(Precision p) {
  return std::make_unique<CpuBackend>(p);
}

}  // namespace loom::kernels::cpu
