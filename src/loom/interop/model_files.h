// Opening a model from any file loom reads (docs/formats.md "Model files"): a loom
// checkpoint (a step folder, a run.dir or a checkpoint root: the newest complete one), a
// Hugging Face GPT-2 folder (config.json + model.safetensors) or a bare .safetensors file
// (config.json beside it, or the loom_model entry loom's exports keep in its metadata).
// Whatever it is, the weights come out under loom's names and layouts ("param/h3.qkvw",
// (3,C,C)) through ckpt::TensorSource, so `loom sample/eval --model`, `train.init_from` and
// `loom export` read every kind the same way, and any parallel layout loads from them.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/ckpt/tensor_source.h"
#include "loom/model/gpt.h"

namespace loom::interop {

struct ModelFile {
  std::string path;  // what was opened: a checkpoint folder, a .safetensors file
  std::string kind;  // "loom checkpoint" or "Hugging Face GPT-2"
  model::GptConfig config;
  std::shared_ptr<const ckpt::TensorSource> weights;  // "param/<loom name>", loom shapes
  nlohmann::json meta;                                // a loom checkpoint's meta, else null
};

// UserError naming the path when it is none of the above, or its config or tensors do not
// describe a GPT-2 loom can run (another activation or epsilon, untied head, a tensor
// missing or of another shape, a damaged file).
ModelFile open_model(const std::string& path);

// Every parameter of a whole model (own storage, no tensor split) from `weights`.
void load_params(const ckpt::TensorSource& weights, model::Gpt& m);

// Hugging Face's GPT2Config for c (config.json), and back.
nlohmann::json hf_config(const model::GptConfig& c);
model::GptConfig config_from_hf(const nlohmann::json& j, const std::string& where);

// "tiny", "gpt2-124m", ... when c has a named config's shape, else "custom LxC".
std::string shape_name(const model::GptConfig& c);
// "12 layers, 12 heads, 768 wide, context 1024, vocabulary 50257" (for errors).
std::string describe_shape(const model::GptConfig& c);

}  // namespace loom::interop
