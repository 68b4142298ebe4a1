#include "loom/interop/model_files.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/safetensors.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/interop/gpt2_layout.h"

namespace loom::interop {
namespace fs = std::filesystem;

namespace {

// A Hugging Face GPT-2 safetensors file read as loom tensors: each tensor is converted whole
// on first use (transposed, vocabulary padded) and the last one kept, so the regions a
// rank's units ask for one after another cost one conversion.
class HfWeights : public ckpt::TensorSource {
 public:
  HfWeights(const std::string& path, const model::GptConfig& c) : file_(path) {
    std::set<std::string> used;
    for (const MappedTensor& t : hf_tensors(c)) {
      // Hugging Face's own GPT-2 files name tensors without the "transformer." prefix.
      std::string name = t.other;
      if (!file_.find(name) && file_.find(name.substr(std::string("transformer.").size())))
        name = name.substr(std::string("transformer.").size());
      const ckpt::SafetensorsTensor* f = file_.find(name);
      if (!f)
        throw UserError(path + " has no tensor " + t.other + " (" + describe_shape(c) + ")",
                        "is it a GPT-2 model, and does its config.json describe it?");
      if (f->shape != t.other_shape)
        throw UserError(path + ": tensor " + name + " has shape " + dims(f->shape) + ", " +
                            dims(t.other_shape) + " expected for " + describe_shape(c),
                        "config.json does not describe this file");
      used.insert(name);
      by_loom_["param/" + t.loom] = {t, name};
    }
    for (const auto& f : file_.tensors()) {
      if (used.count(f.name)) continue;
      // The causal masks GPT2Attention registers, and the LM head tied to wte.
      if (f.name.ends_with("attn.bias") || f.name.ends_with("attn.masked_bias") ||
          f.name == "lm_head.weight")
        continue;
      throw UserError(path + " holds a tensor loom's GPT-2 has no place for: " + f.name,
                      "loom reads GPT-2 models (GPT2LMHeadModel) only");
    }
  }
  bool has(const std::string& tensor) const override { return by_loom_.count(tensor) > 0; }
  Shape shape(const std::string& tensor) const override { return entry(tensor).t.loom_shape; }
  void read(const std::string& tensor, const Shape& shape, const ckpt::Region& q,
            float* out) const override {
    const Entry& e = entry(tensor);
    if (shape != e.t.loom_shape)
      throw UserError(file_.path() + ": " + tensor + " has shape " + dims(e.t.loom_shape) +
                          ", the model expects " + dims(shape),
                      "the model file and the configuration describe different models");
    if (cached_ != tensor) {
      cache_ = from_other(e.t, file_.read_f32(e.name));
      cached_ = tensor;
    }
    for_each_box_run(shape, q.start, q.extent, q.begin, q.count,
                     [&](int64_t pos, int64_t flat, int64_t len) {
                       std::copy_n(cache_.data() + flat, len, out + (pos - q.begin));
                     });
  }

 private:
  struct Entry {
    MappedTensor t;
    std::string name;  // in the file
  };
  const Entry& entry(const std::string& tensor) const {
    auto it = by_loom_.find(tensor);
    if (it == by_loom_.end())
      throw UserError(file_.path() + " has nothing for " + tensor, "is it a GPT-2 model?");
    return it->second;
  }
  static std::string dims(const Shape& s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
    return out + ")";
  }
  ckpt::SafetensorsFile file_;
  std::map<std::string, Entry> by_loom_;
  mutable std::string cached_;
  mutable std::vector<float> cache_;
};

model::GptConfig config_beside(const std::string& safetensors, const std::string& config_path) {
  if (fs::exists(config_path)) {
    nlohmann::json j = nlohmann::json::parse(read_file(config_path), nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw UserError(config_path + " is not a JSON object", "is it a Hugging Face config.json?");
    return config_from_hf(j, config_path);
  }
  ckpt::SafetensorsFile f(safetensors);
  if (auto it = f.metadata().find("loom_model"); it != f.metadata().end()) {
    nlohmann::json j = nlohmann::json::parse(it->second, nullptr, false);
    if (!j.is_discarded()) return model::GptConfig::from_json(j);
  }
  throw UserError("cannot tell the shape of the model in " + safetensors +
                      ": there is no config.json beside it",
                  "put the model's Hugging Face config.json in the same folder");
}

ModelFile open_checkpoint(const std::string& dir) {
  auto r = std::make_shared<ckpt::Reader>(dir);
  ModelFile m;
  m.path = dir;
  m.kind = "loom checkpoint";
  m.meta = r->meta();
  if (!m.meta.contains("model"))
    throw UserError("checkpoint " + dir + " does not describe its model",
                    "it was not written by `loom train`");
  m.config = model::GptConfig::from_json(m.meta["model"]);
  m.weights = std::move(r);
  return m;
}

ModelFile open_safetensors(const std::string& file, const std::string& config_path) {
  ModelFile m;
  m.path = file;
  m.kind = "Hugging Face GPT-2";
  m.config = config_beside(file, config_path);
  m.weights = std::make_shared<HfWeights>(file, m.config);
  return m;
}

}  // namespace

std::string describe_shape(const model::GptConfig& c) {
  return std::to_string(c.n_layer) + " layers, " + std::to_string(c.n_head) + " heads, " +
         std::to_string(c.n_embd) + " wide, context " + std::to_string(c.block_size) +
         ", vocabulary " + std::to_string(c.vocab_size);
}

std::string shape_name(const model::GptConfig& c) {
  for (const char* n : {"tiny", "small", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m"}) {
    model::GptConfig k = model::GptConfig::named(n);
    if (k.n_layer == c.n_layer && k.n_head == c.n_head && k.n_embd == c.n_embd &&
        k.block_size == c.block_size && k.vocab_size == c.vocab_size &&
        k.padded_vocab_size == c.padded_vocab_size)
      return n;
  }
  return "custom " + std::to_string(c.n_layer) + "x" + std::to_string(c.n_embd);
}

nlohmann::json hf_config(const model::GptConfig& c) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_embd", c.n_embd},
          {"n_positions", c.block_size},
          {"n_ctx", c.block_size},
          {"n_inner", nullptr},
          {"vocab_size", c.vocab_size},
          {"layer_norm_epsilon", 1e-5},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"use_cache", true},
          {"bos_token_id", 50256},
          {"eos_token_id", 50256},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"},
          {"loom_model", c.name}};
}

model::GptConfig config_from_hf(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& why) {
    return UserError(where + ": " + why,
                     "loom runs GPT-2 models (GPT2LMHeadModel) as OpenAI "
                     "defined them: tanh GELU, LayerNorm eps 1e-5, tied head");
  };
  auto integer = [&](const char* key, const char* fallback = nullptr) -> int {
    const nlohmann::json* v = j.contains(key) ? &j[key] : nullptr;
    if ((!v || v->is_null()) && fallback && j.contains(fallback)) v = &j[fallback];
    if (!v || !v->is_number_integer()) throw bad(std::string("no integer ") + key);
    return v->get<int>();
  };
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw bad("model_type " + j["model_type"].dump() + " is not gpt2");
  model::GptConfig c;
  c.n_layer = integer("n_layer");
  c.n_head = integer("n_head");
  c.n_embd = integer("n_embd");
  c.block_size = integer("n_positions", "n_ctx");
  c.vocab_size = integer("vocab_size");
  c.padded_vocab_size = (c.vocab_size + 127) / 128 * 128;
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw bad("activation_function \"" + act + "\" is not the tanh GELU (gelu_new)");
  const double eps = j.value("layer_norm_epsilon", 1e-5);
  if (std::abs(eps - 1e-5) > 1e-12)
    throw bad("layer_norm_epsilon " + std::to_string(eps) + " is not 1e-5");
  if (!j.value("tie_word_embeddings", true)) throw bad("the LM head is not tied to wte");
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != 4 * c.n_embd)
    throw bad("n_inner " + j["n_inner"].dump() + " is not 4 x n_embd");
  if (j.value("scale_attn_by_inverse_layer_idx", false))
    throw bad("scale_attn_by_inverse_layer_idx is not supported");
  c.validate();
  c.name = shape_name(c);
  if (j.contains("loom_model") && j["loom_model"].is_string()) {
    // loom's own export: keep the run's name when the shape is that config's.
    const std::string n = j["loom_model"];
    if (shape_name(c) == n || n.rfind("custom", 0) == 0) c.name = n;
  }
  return c;
}

ModelFile open_model(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw UserError("model " + path + " does not exist",
                    "pass a loom checkpoint or run.dir, a Hugging Face GPT-2 folder or a "
                    ".safetensors file");
  if (fs::is_regular_file(path, ec)) {
    if (!path.ends_with(".safetensors"))
      throw UserError("model file " + path + " is not a .safetensors file",
                      "loom reads safetensors (Hugging Face) and its own checkpoints; "
                      "GGUF is written, not read");
    return open_safetensors(path, (fs::path(path).parent_path() / "config.json").string());
  }
  if (fs::exists(path + "/manifest.json")) return open_checkpoint(path);
  if (fs::exists(path + "/model.safetensors"))
    return open_safetensors(path + "/model.safetensors", path + "/config.json");
  if (fs::exists(path + "/model.safetensors.index.json"))
    throw UserError(path + " holds a sharded safetensors model",
                    "merge it into one model.safetensors (GPT-2 models fit one file)");
  for (const std::string& root : {path + "/ckpt", path}) {
    const std::string newest = ckpt::latest(root);
    if (!newest.empty()) return open_checkpoint(newest);
  }
  throw UserError(path + " holds no loom checkpoint and no model.safetensors",
                  "pass a checkpoint folder (run.dir/ckpt/step_*), a run.dir, or a Hugging Face "
                  "GPT-2 folder");
}

void load_params(const ckpt::TensorSource& weights, model::Gpt& m) {
  for (const model::Tensor& t : m.tensors())
    weights.read("param/" + t.name, t.shape, {t.start, t.extent, 0, static_cast<int64_t>(t.size)},
                 m.params() + t.offset);
}

}  // namespace loom::interop
