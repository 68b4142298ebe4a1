// `loom export`: a model (interop/model_files.h: any loom checkpoint, whatever layout wrote
// it, or a Hugging Face GPT-2) out as
//
//   hf    a folder GPT2LMHeadModel.from_pretrained() loads: model.safetensors (Hugging Face's
//         names, Conv1D layout, vocabulary cut to 50,257), config.json, generation_config.json,
//         and the tokenizer (vocab.json, merges.txt, tokenizer_config.json,
//         special_tokens_map.json) derived from loom's pinned vocabulary;
//   gguf  one GGUF v3 file for llama.cpp's gpt2 architecture, with its tokenizer metadata
//         (tokenizer.ggml.pre = "gpt-2", or llama.cpp splits text differently).
//
// Tensors are converted and written one at a time (peak memory: the largest tensor, about
// twice). The output appears only when complete (a temporary name renamed into place);
// an existing output is an error and is never touched.
#pragma once

#include <string>

#include "loom/core/dtype.h"
#include "loom/data/tokenizer.h"
#include "loom/interop/model_files.h"

namespace loom::interop {

struct ExportSummary {
  size_t tensors = 0;
  uint64_t bytes = 0;  // of the model file
  double seconds = 0;
};

// dtype: F32, F16 or BF16 for the matrices and embeddings (LayerNorms and biases stay F32).
ExportSummary export_hf(const ModelFile& m, const std::string& out_dir, DType dtype,
                        const data::Gpt2Tokenizer& tok);
ExportSummary export_gguf(const ModelFile& m, const std::string& out_file, DType dtype,
                          const data::Gpt2Tokenizer& tok);

}  // namespace loom::interop
