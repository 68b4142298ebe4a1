// CPU forward/backward kernels of the GPT-2 layers, the specification any other device's
// kernels must match (llm.c's layout: each layer's forward and backward side by side).
//
// The rule of every kernel here: forward writes its outputs with `=`; backward ACCUMULATES
// into every gradient it produces (parameters and inputs alike) with `+=`, so a caller zeroes
// gradients once per step and residual branches simply add up.
//
// Shapes: B batch, T time, C channels, NH heads (C % NH == 0), OC output channels,
// V vocabulary, Vp vocabulary padded (logits beyond V are ignored by the loss), N = B*T.
// All buffers are row-major float32 unless stated.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/kernels/cpu/gemm.h"

namespace loom::kernels::cpu {

// out (B,T,C) = wte[tokens] + wpe[t];  tokens (B,T), wte (V,C), wpe (maxT,C)
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                     int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C);
// The two halves of the encoder for a vocabulary shard (tensor parallelism): wte_shard
// (Vl,C) holds rows [vbegin, vbegin + Vl) of wte; tokens (N).
// out (N,C) = the token's row where the shard holds it, 0 elsewhere.
void embedding_shard_forward(float* out, const int* tokens, const float* wte_shard, int vbegin,
                             int Vl, int N, int C);
void embedding_shard_backward(float* dwte_shard, const float* dout, const int* tokens, int vbegin,
                              int Vl, int N, int C);
// out (R,C) += wpe[position of row]: rows [row_begin, row_begin + R) of the (B,T) token
// rows, so a row's position is its index mod T.
void position_forward(float* out, const float* wpe, int row_begin, int R, int T, int C);
void position_backward(float* dwpe, const float* dout, int row_begin, int R, int T, int C);

// out (N,C) = (inp - mean) * rstd * weight + bias, per row; mean, rstd (N) are saved; with
// out16 also out rounded to bf16 (what the next product reads), in the same pass.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, uint16_t* out16 = nullptr);
// res = a + b, then out = layernorm(res) as above: a residual add and the LayerNorm that
// reads it in one pass over the rows (the same numbers as residual_forward and then
// layernorm_forward).
void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* weight, const float* bias, int N,
                                int C, uint16_t* out16 = nullptr);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);
// Its two halves (layernorm_backward runs both), for a backward split into input and weight
// gradients.
void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C);
void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C);

// out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC); bias may be null (it is added inside
// the product). The products run through `gemm` (oneDNN), in its precision (fp32, or bf16
// operands with fp32 accumulation). weight16, where given, is the weight already rounded to
// bf16 (read by bf16 products instead of rounding it again); inp16 likewise for inp (written
// by the pass that produced inp), dout16 for dout, which the backward otherwise rounds once
// for both of its products.
void matmul_forward(Gemm& gemm, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC, const uint16_t* weight16 = nullptr,
                    const uint16_t* inp16 = nullptr);
// A backward's `assign` (false by default) breaks the += rule for the input gradient: it is
// written with `=`, for a caller whose buffer has no other contribution (no zeroing pass).
void matmul_backward(Gemm& gemm, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC,
                     const uint16_t* weight16 = nullptr, const uint16_t* dout16 = nullptr,
                     bool assign = false);
// Its two halves (input gradient; weight and bias gradients), the same products.
void matmul_backward_input(Gemm& gemm, float* dinp, const float* dout, const float* weight, int N,
                           int C, int OC, const uint16_t* weight16 = nullptr,
                           const uint16_t* dout16 = nullptr, bool assign = false);
void matmul_backward_weight(Gemm& gemm, float* dweight, float* dbias, const float* dout,
                            const float* inp, int N, int C, int OC,
                            const uint16_t* dout16 = nullptr);
// The instruction sets the few-row products below are built for: kAuto takes the best the CPU
// has; tests name each one the CPU has (rows_isa_available), so every build is checked.
enum class RowsIsa { kAuto, kAvx512, kAvx2, kBaseline };
bool rows_isa_available(RowsIsa isa);
// The forward on a few rows (R up to ~16; generation) with fp32 weights: each weight piece
// loaded once for up to 8 rows (decoding a batch of sequences; oneDNN's products at M = 8 ran
// at ~1/3 of the bytes and FLOPs this machine allows).
void matmul_forward_rows(float* out, const float* inp, const float* weight, const float* bias,
                         int R, int C, int OC, RowsIsa isa = RowsIsa::kAuto);
// The forward on a few rows (R up to ~16; generation) with bf16 weights (raw bits, widened
// in registers; half the bytes of fp32 to read), fp32 products and sums.
void matmul_forward_rows_bf16(float* out, const float* inp, const uint16_t* weight,
                              const float* bias, int R, int C, int OC,
                              RowsIsa isa = RowsIsa::kAuto);
// out (N,OC) += bias (OC) on every row (a row-parallel linear's bias, after its reduction).
void bias_forward(float* out, const float* bias, int N, int OC);

// Causal multi-head self-attention. inp (B,T,3C) holds q, k, v; out (B,T,C);
// att (B,NH,T,T) = softmax of the scaled, masked q.k, saved for backward.
// Backward overwrites scratch (B,NH,T,T) and accumulates into dinp (B,T,3C).
void attention_forward(Gemm& gemm, float* out, float* att, const float* inp, int B, int T, int C,
                       int NH);
void attention_backward(Gemm& gemm, float* dinp, float* scratch, const float* dout,
                        const float* inp, const float* att, int B, int T, int C, int NH,
                        bool assign = false);
// Attention of R new rows over cached keys and values (generation): row r's query (inside
// qkv (R,3C), as in attention_forward) attends to positions [0, len[r]) of its sequence,
// whose keys and values are k[r], v[r] (NH, cap, hs) each. out (R,C); scratch (R,NH,cap).
// Decoding's bookkeeping (kernels/backend.h): embeddings of rows at any positions, and the
// rows' keys and values appended to the cache.
void embed_rows(float* out, const int* tokens, const int* positions, const float* wte,
                const float* wpe, int R, int C);
void kv_append(float* k, float* v, const float* qkv, const int* seq, const int* pos, int R, int C,
               int NH, int cap);
void attention_decode(float* out, float* scratch, const float* qkv, const float* const* k,
                      const float* const* v, const int* len, int R, int C, int NH, int cap);

// GELU, tanh approximation (as GPT-2 and PyTorch's approximate="tanh"); with out16 also out
// rounded to bf16, in the same pass.
void gelu_forward(float* out, const float* inp, size_t n, uint16_t* out16 = nullptr);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, bool assign = false);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, size_t n);
void residual_backward(float* da, float* db, const float* dout, size_t n);

// Softmax + cross-entropy over the first V of Vp logit columns (the padding ignored), fused:
// losses (N) = log(sum_i e^(l_i - max)) + max - l[target], keeping each row's max and that
// sum (N each) for the backward. The logits are only read.
void crossentropy_forward(float* losses, float* row_max, float* row_sum, const float* logits,
                          const int* targets, int N, int V, int Vp);
// Its backward for a loss that weighs every position by dloss (the mean: 1/N), in place, the
// one exception to the += rule: logits become dlogits = (softmax - onehot(target)) * dloss
// (padded entries 0) in one pass from the forward's row max and sum; with dlogits16 (N,Vp)
// also their bf16 rounding, for the head's bf16 products.
void crossentropy_backward_inplace(float* logits, uint16_t* dlogits16, const float* row_max,
                                   const float* row_sum, float dloss, const int* targets, int N,
                                   int V, int Vp);

// The local parts of a vocab-parallel softmax + cross-entropy: logits (N,Vl) hold columns
// [vbegin, vbegin + Vl) of the (N,Vp) logits, the first `valid` of them real vocabulary
// (the rest padding). model/vocab_parallel_loss.h combines them across ranks.
// maxv (N) = the row maxima over the real columns (-inf when there are none).
void logits_shard_max(float* maxv, const float* logits, int N, int Vl, int valid);
// picked (N) = the target's logit where this shard holds the target, 0 elsewhere.
void logits_shard_target(float* picked, const float* logits, const int* targets, int N, int Vl,
                         int vbegin, int valid);
// In place: logits -> e^(logit - maxv[row]) on real columns, 0 on padding; sums (N) = row sums.
void softmax_shard_exp(float* logits, float* sums, const float* maxv, int N, int Vl, int valid);
// probs (N,Vl) *= 1/sums[row].
void softmax_shard_scale(float* probs, const float* sums, int N, int Vl, int valid);
// In place: probs -> (probs - onehot(target)) * dloss, the target subtracted by the shard
// that holds it.
void crossentropy_shard_backward_inplace(float* probs, float dloss, const int* targets, int N,
                                         int Vl, int vbegin, int valid);

// One AdamW step (PyTorch's formulation, decoupled weight decay), t >= 1, on
// grads * grad_scale.
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale = 1.0f);

}  // namespace loom::kernels::cpu
