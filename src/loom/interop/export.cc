#include "loom/interop/export.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/gguf.h"
#include "loom/ckpt/safetensors.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/data/bpe_files.h"
#include "loom/interop/gpt2_layout.h"

namespace loom::interop {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

void refuse_existing(const std::string& out) {
  if (fs::exists(out))
    throw UserError("output " + out + " already exists",
                    "choose a new --out, or remove the old one if you mean to replace it");
  const fs::path parent = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : ".";
  if (!fs::is_directory(parent))
    throw UserError("the folder of --out " + out + " does not exist", "create it first");
}

void require_gpt2_vocabulary(const ModelFile& m, const char* format) {
  if (m.config.vocab_size != data::Gpt2Tokenizer::kVocabSize)
    throw UserError(std::string("--format ") + format + " writes GPT-2's tokenizer, but " + m.path +
                        " has a vocabulary of " + std::to_string(m.config.vocab_size),
                    "export models trained on loom's GPT-2 tokens (vocabulary 50257)");
}

// loom's whole tensor `name` from the model's weights.
std::vector<float> read_whole(const ModelFile& m, const MappedTensor& t) {
  std::vector<float> v(static_cast<size_t>(numel(t.loom_shape)));
  m.weights->read("param/" + t.loom, t.loom_shape, {{}, {}, 0, numel(t.loom_shape)}, v.data());
  return v;
}

DType stored_dtype(const MappedTensor& t, DType matrices) {
  return t.other_shape.size() >= 2 ? matrices : DType::kF32;
}

}  // namespace

ExportSummary export_hf(const ModelFile& m, const std::string& out_dir, DType dtype,
                        const data::Gpt2Tokenizer& tok) {
  const auto t0 = Clock::now();
  refuse_existing(out_dir);
  require_gpt2_vocabulary(m, "hf");
  const std::vector<MappedTensor> tensors = hf_tensors(m.config);
  std::vector<ckpt::SafetensorsTensor> specs;
  for (const MappedTensor& t : tensors)
    specs.push_back({t.other, stored_dtype(t, dtype), t.other_shape});
  const std::string tmp = out_dir + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(tmp);
  ExportSummary s;
  try {
    // transformers refuses a safetensors file without format = pt in its metadata.
    write_safetensors(tmp + "/model.safetensors", specs,
                      [&](size_t i, std::vector<float>& out) {
                        out = to_other(tensors[i], read_whole(m, tensors[i]));
                      },
                      {{"format", "pt"}, {"loom_model", m.config.to_json().dump()}});
    nlohmann::json config = hf_config(m.config);
    config["torch_dtype"] = dtype == DType::kF32   ? "float32"
                            : dtype == DType::kF16 ? "float16"
                                                   : "bfloat16";
    write_file_atomic(tmp + "/config.json", config.dump(2) + "\n");
    write_file_atomic(tmp + "/generation_config.json",
                      nlohmann::json{{"_from_model_config", true},
                                     {"bos_token_id", data::Gpt2Tokenizer::kEndOfText},
                                     {"eos_token_id", data::Gpt2Tokenizer::kEndOfText}}
                              .dump(2) +
                          "\n");
    write_file_atomic(tmp + "/vocab.json", data::vocab_json(tok));
    write_file_atomic(tmp + "/merges.txt", data::merges_txt(tok));
    const std::string eot = "<|endoftext|>";
    write_file_atomic(tmp + "/tokenizer_config.json",
                      nlohmann::json{{"tokenizer_class", "GPT2Tokenizer"},
                                     {"model_max_length", m.config.block_size},
                                     {"add_prefix_space", false},
                                     {"bos_token", eot},
                                     {"eos_token", eot},
                                     {"unk_token", eot}}
                              .dump(2) +
                          "\n");
    write_file_atomic(
        tmp + "/special_tokens_map.json",
        nlohmann::json{{"bos_token", eot}, {"eos_token", eot}, {"unk_token", eot}}.dump(2) + "\n");
    s.bytes = fs::file_size(tmp + "/model.safetensors");
    fs::rename(tmp, out_dir);
    fsync_dir(fs::path(out_dir).has_parent_path() ? fs::path(out_dir).parent_path().string() : ".");
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  s.tensors = tensors.size();
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

ExportSummary export_gguf(const ModelFile& m, const std::string& out_file, DType dtype,
                          const data::Gpt2Tokenizer& tok) {
  const auto t0 = Clock::now();
  refuse_existing(out_file);
  require_gpt2_vocabulary(m, "gguf");
  const model::GptConfig& c = m.config;
  ckpt::GgufWriter w;
  w.set("general.architecture", std::string("gpt2"));
  w.set("general.name", c.name);
  w.set("general.file_type", uint32_t{dtype == DType::kF32 ? 0u : dtype == DType::kF16 ? 1u : 32u});
  w.set("general.alignment", uint32_t{32});
  w.set("gpt2.context_length", static_cast<uint32_t>(c.block_size));
  w.set("gpt2.embedding_length", static_cast<uint32_t>(c.n_embd));
  w.set("gpt2.feed_forward_length", static_cast<uint32_t>(4 * c.n_embd));  // missing: aborts
  w.set("gpt2.block_count", static_cast<uint32_t>(c.n_layer));
  w.set("gpt2.attention.head_count", static_cast<uint32_t>(c.n_head));
  w.set("gpt2.attention.layer_norm_epsilon", 1e-5f);
  w.set("tokenizer.ggml.model", std::string("gpt2"));
  w.set("tokenizer.ggml.pre", std::string("gpt-2"));  // missing: text split differently
  w.set("tokenizer.ggml.tokens", data::token_spellings(tok));
  std::vector<int32_t> types(data::Gpt2Tokenizer::kVocabSize, 1);  // normal
  types[data::Gpt2Tokenizer::kEndOfText] = 3;                      // control
  w.set("tokenizer.ggml.token_type", types);
  const std::vector<std::string> spell = data::token_spellings(tok);
  std::vector<std::string> merges;
  for (auto [a, b] : data::derive_merges(tok)) merges.push_back(spell[a] + " " + spell[b]);
  w.set("tokenizer.ggml.merges", merges);
  w.set("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(data::Gpt2Tokenizer::kEndOfText));
  w.set("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(data::Gpt2Tokenizer::kEndOfText));
  const std::vector<MappedTensor> tensors = gguf_tensors(c);
  for (const MappedTensor& t : tensors)
    w.add_tensor({t.other, t.other_shape, stored_dtype(t, dtype)});
  w.write(out_file, [&](size_t i, std::vector<float>& out) {
    out = to_other(tensors[i], read_whole(m, tensors[i]));
  });
  ExportSummary s;
  s.tensors = tensors.size();
  s.bytes = fs::file_size(out_file);
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

}  // namespace loom::interop
