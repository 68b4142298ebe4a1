// loom's GPT tensors under the names and layouts of other programs (INTEROP-NOTES, docs/
// formats.md "Model files").
//
//   loom (model/gpt.h)     Hugging Face GPT2LMHeadModel               GGUF (llama.cpp gpt2)
//   wte (Vp,C)             transformer.wte.weight (V,C): V real rows    token_embd.weight
//   wpe (T,C)              transformer.wpe.weight                       position_embd.weight
//   hL.ln1w / ln1b         transformer.h.L.ln_1.weight / bias           blk.L.attn_norm.*
//   hL.qkvw (3,C,C)        transformer.h.L.attn.c_attn.weight (C,3C)^T  blk.L.attn_qkv.weight
//   hL.qkvb (3,C)          transformer.h.L.attn.c_attn.bias (3C)        blk.L.attn_qkv.bias
//   hL.attprojw (C,C)      transformer.h.L.attn.c_proj.weight ^T        blk.L.attn_output.*
//   hL.ln2w / ln2b         transformer.h.L.ln_2.*                       blk.L.ffn_norm.*
//   hL.fcw (4C,C)          transformer.h.L.mlp.c_fc.weight (C,4C) ^T    blk.L.ffn_up.*
//   hL.fcprojw (C,4C)      transformer.h.L.mlp.c_proj.weight (4C,C) ^T  blk.L.ffn_down.*
//   lnfw / lnfb            transformer.ln_f.*                           output_norm.*
//
// loom stores matrices as PyTorch's Linear does, (out, in); Hugging Face's GPT-2 uses
// Conv1D, (in, out): every matrix is transposed (^T). GGUF keeps loom's bytes (a matrix's
// ggml dims are (in, out)). Both cut the vocabulary from loom's padded Vp rows to V; the
// LM head is tied to the token embedding in all three (no lm_head / output tensor).
#pragma once

#include <string>
#include <vector>

#include "loom/core/box.h"
#include "loom/model/gpt.h"

namespace loom::interop {

struct MappedTensor {
  std::string loom;   // loom's name (model::Tensor::name, without "param/")
  std::string other;  // the other program's name
  Shape loom_shape;   // loom's whole shape
  Shape other_shape;  // the other program's shape (row-major)
  bool transpose;     // a matrix: other = loom^T (loom's 3-d qkvw read as (3C, C))
  bool cut_vocab;     // wte: the first V of Vp rows
};

std::vector<MappedTensor> hf_tensors(const model::GptConfig& c);
std::vector<MappedTensor> gguf_tensors(const model::GptConfig& c);

// The other program's values of t from loom's whole tensor `loom` (numel(t.loom_shape)).
std::vector<float> to_other(const MappedTensor& t, const std::vector<float>& loom);
// loom's values of t from the other program's (padded vocabulary rows zero).
std::vector<float> from_other(const MappedTensor& t, const std::vector<float>& other);

}  // namespace loom::interop
