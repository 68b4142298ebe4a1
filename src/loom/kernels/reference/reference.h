// The reference kernels: GPT-2's layers as plain loops (llm.c's style), one obviously
// correct line of arithmetic after another — no oneDNN, no SIMD, no threads, sums in
// double. They are the oracle the fast CPU kernels (kernels/cpu/kernels.h) are tested
// against, kernel by kernel, and the first thing to read when porting the kernels to
// another device: the same names, shapes and rules.
//
// Rules (as kernels/cpu): forward writes its outputs with `=`; backward ACCUMULATES into
// every gradient with `+=` (crossentropy_backward excepted: it writes dlogits). Shapes: B
// batch, T time, C channels, NH heads, OC output channels, V vocabulary, Vp padded
// vocabulary (logits past V ignored), N = B*T rows. Row-major float32.
//
// bf16: where `bf16` is true a product reads its operands rounded to bf16 (round to
// nearest even) and accumulates in full precision, as the fast kernels' bf16 mode and
// PyTorch's CPU autocast do; everything else stays float32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::kernels::reference {

// x rounded to bf16 and back (round to nearest even; NaN stays NaN).
float round_bf16(float x);

// out (B,T,C) = wte[tokens] + wpe[t]
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                     int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C);

// out (N,C) = (inp - mean) / sqrt(var + 1e-5) * weight + bias per row (biased variance);
// mean and rstd (N) are saved for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);
// Its two halves: dinp alone; dweight and dbias alone.
void layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C);
void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C);

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC; may be null).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, bool bf16);
// dinp += dout @ weight, dweight += dout^T @ inp, dbias += column sums of dout (if given).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, bool bf16);
// Its two halves: dinp alone; dweight and dbias alone.
void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                           int OC, bool bf16);
void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                            int N, int C, int OC, bool bf16);

// Causal self-attention: inp (B,T,3C) holds q, k, v per row; hs = C/NH; per (b, h, t):
// att[t2] = softmax over t2 <= t of q_t . k_t2 / sqrt(hs) (0 for t2 > t), saved (B,NH,T,T);
// out (B,T,C) = sum_t2 att[t2] v_t2.
void attention_forward(float* out, float* att, const float* inp, int B, int T, int C, int NH,
                       bool bf16);
// dinp (B,T,3C) += the gradients of q, k and v.
void attention_backward(float* dinp, const float* dout, const float* inp, const float* att, int B,
                        int T, int C, int NH, bool bf16);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

void residual_forward(float* out, const float* a, const float* b, size_t n);
void residual_backward(float* da, float* db, const float* dout, size_t n);

// losses (N) = -log softmax(logits row over the first V columns)[target].
void crossentropy_forward(float* losses, const float* logits, const int* targets, int N, int V,
                          int Vp);
// dlogits (N,Vp) = (softmax - onehot(target)) * dloss on the first V columns, 0 on padding
// (written, not accumulated).
void crossentropy_backward(float* dlogits, const float* logits, const int* targets, float dloss,
                           int N, int V, int Vp);

// One AdamW step (PyTorch's torch.optim.AdamW, decoupled weight decay) on grads *
// grad_scale, step t >= 1.
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale = 1.0f);

}  // namespace loom::kernels::reference
