// The device the model's arithmetic runs on: every kernel the GPT model, its tensor-parallel
// loss, generation and the optimizer call, behind one interface, so a new device is a new
// folder (kernels/<device>/) with one class, not an edit of the model.
//
// Two implementations:
//   "cpu"        kernels/cpu/: the optimised kernels (oneDNN products, AVX2/AVX-512 loops,
//                OpenMP), and what `loom train` runs by default.
//   "reference"  kernels/reference/: plain loops, sums in double, no library, no SIMD, no
//                threads (llm.c's style): the oracle the tests hold the fast backend to,
//                kernel by kernel and whole model, and the first file to read when porting.
//
// Every kernel keeps kernels/cpu/kernels.h's contract (shapes, `=` forward, `+=` backward,
// the named exceptions); that header documents each one. Their pointers are in the
// backend's memory(): the model's buffers come from it (kernels/memory.h); the two backends
// here both use host memory.
//
// bf16: in Precision::kBF16 a matrix product reads its operands rounded to bf16 and
// accumulates in fp32. A backend that `reads_bf16()` accepts bf16 copies of operands made
// ahead (the *16 arguments: a weight rounded once per forward, an operand a previous pass
// wrote) and hands out staging buffers for them; one that does not ignores them, and
// staging_bf16 returns null (then every product rounds its own operands: the same values).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/kernels/memory.h"

namespace loom::kernels {

enum class Precision { kF32, kBF16 };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Where this backend's kernels read and write: the model allocates its buffers there.
  virtual std::shared_ptr<Memory> memory() const = 0;

  virtual Precision precision() const = 0;
  virtual void set_precision(Precision p) = 0;
  // Whether products read caller-made bf16 copies (native bf16 products on this device).
  virtual bool reads_bf16() const = 0;
  // A bf16 buffer of n elements in staging slot `slot` (kStagingSlots), valid until the
  // slot's next use; null unless reads_bf16() and staging is on.
  static constexpr int kStagingSlots = 4;
  virtual uint16_t* staging_bf16(int64_t n, int slot = 0) = 0;
  // Off: staging_bf16 returns null, so every product rounds its own operands (the same bits;
  // the tests' reference).
  virtual void set_staging(bool on) = 0;
  // out[i] = x[i] rounded to bf16 (nearest even).
  virtual void round_to_bf16(uint16_t* out, const float* x, int64_t n) = 0;

  // Embeddings (whole, a vocabulary shard's, positions for a range of rows).
  virtual void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                               int B, int T, int C) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens,
                                int B, int T, int C) = 0;
  virtual void embedding_shard_forward(float* out, const int* tokens, const float* wte_shard,
                                       int vbegin, int Vl, int N, int C) = 0;
  virtual void embedding_shard_backward(float* dwte_shard, const float* dout, const int* tokens,
                                        int vbegin, int Vl, int N, int C) = 0;
  virtual void position_forward(float* out, const float* wpe, int row_begin, int R, int T,
                                int C) = 0;
  virtual void position_backward(float* dwpe, const float* dout, int row_begin, int R, int T,
                                 int C) = 0;

  // LayerNorm, alone and fused after a residual add; its backward whole and in halves.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C,
                                 uint16_t* out16 = nullptr) = 0;
  virtual void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                          const float* a, const float* b, const float* weight,
                                          const float* bias, int N, int C,
                                          uint16_t* out16 = nullptr) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  virtual void layernorm_backward_input(float* dinp, const float* dout, const float* inp,
                                        const float* weight, const float* mean, const float* rstd,
                                        int N, int C) = 0;
  virtual void layernorm_backward_weight(float* dweight, float* dbias, const float* dout,
                                         const float* inp, const float* mean, const float* rstd,
                                         int N, int C) = 0;

  // Linear layers: out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias, and its backward whole
  // and in halves (input gradient; weight and bias gradients).
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int C, int OC, const uint16_t* weight16 = nullptr,
                              const uint16_t* inp16 = nullptr) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int C, int OC,
                               const uint16_t* weight16 = nullptr, const uint16_t* dout16 = nullptr,
                               bool assign = false) = 0;
  virtual void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N,
                                     int C, int OC, const uint16_t* weight16 = nullptr,
                                     const uint16_t* dout16 = nullptr, bool assign = false) = 0;
  virtual void matmul_backward_weight(float* dweight, float* dbias, const float* dout,
                                      const float* inp, int N, int C, int OC,
                                      const uint16_t* dout16 = nullptr) = 0;
  // The forward on a few rows (generation: a batch of sequences decoding), fp32 weights.
  virtual void matmul_forward_rows(float* out, const float* inp, const float* weight,
                                   const float* bias, int R, int C, int OC) = 0;
  // The forward on a few rows from bf16 weights (generation); fp32 products and sums.
  virtual void matmul_forward_rows_bf16(float* out, const float* inp, const uint16_t* weight,
                                        const float* bias, int R, int C, int OC) = 0;
  virtual void bias_forward(float* out, const float* bias, int N, int OC) = 0;

  // Causal self-attention (training and prefill), and decoding over a key/value cache.
  virtual void attention_forward(float* out, float* att, const float* inp, int B, int T, int C,
                                 int NH) = 0;
  virtual void attention_backward(float* dinp, float* scratch, const float* dout, const float* inp,
                                  const float* att, int B, int T, int C, int NH,
                                  bool assign = false) = 0;
  // Decoding's bookkeeping: out (R,C) = wte[tokens[r]] + wpe[positions[r]]; and row r's
  // key and value (qkv (R,3C): q | k | v) into the caches k, v (batch, NH, cap, hs) at
  // sequence seq[r], position pos[r].
  virtual void embed_rows(float* out, const int* tokens, const int* positions, const float* wte,
                          const float* wpe, int R, int C) = 0;
  virtual void kv_append(float* k, float* v, const float* qkv, const int* seq, const int* pos,
                         int R, int C, int NH, int cap) = 0;
  virtual void attention_decode(float* out, float* scratch, const float* qkv, const float* const* k,
                                const float* const* v, const int* len, int R, int C, int NH,
                                int cap) = 0;

  virtual void gelu_forward(float* out, const float* inp, size_t n, uint16_t* out16 = nullptr) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                             bool assign = false) = 0;
  virtual void residual_forward(float* out, const float* a, const float* b, size_t n) = 0;
  virtual void residual_backward(float* da, float* db, const float* dout, size_t n) = 0;

  // Softmax + cross-entropy over whole rows, and the local parts of the vocab-parallel one.
  virtual void crossentropy_forward(float* losses, float* row_max, float* row_sum,
                                    const float* logits, const int* targets, int N, int V,
                                    int Vp) = 0;
  virtual void crossentropy_backward_inplace(float* logits, uint16_t* dlogits16,
                                             const float* row_max, const float* row_sum,
                                             float dloss, const int* targets, int N, int V,
                                             int Vp) = 0;
  virtual void logits_shard_max(float* maxv, const float* logits, int N, int Vl, int valid) = 0;
  virtual void logits_shard_target(float* picked, const float* logits, const int* targets, int N,
                                   int Vl, int vbegin, int valid) = 0;
  virtual void softmax_shard_exp(float* logits, float* sums, const float* maxv, int N, int Vl,
                                 int valid) = 0;
  virtual void softmax_shard_scale(float* probs, const float* sums, int N, int Vl, int valid) = 0;
  virtual void crossentropy_shard_backward_inplace(float* probs, float dloss, const int* targets,
                                                   int N, int Vl, int vbegin, int valid) = 0;

  virtual void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            int t, float grad_scale = 1.0f) = 0;
};

// The backend called `name` ("cpu" or "reference") in precision p; UserError naming the
// choices otherwise.
std::unique_ptr<Backend> make_backend(const std::string& name, Precision p = Precision::kF32);
// The names make_backend knows, for messages and the config's check.
const char* backend_names();

}  // namespace loom::kernels
