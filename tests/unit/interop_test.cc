// Model files: safetensors written and read back (every dtype, metadata) and every way a
// header can lie refused by name; a model exported to Hugging Face's layout and opened
// again holds the same bits; the GGUF header carries what llama.cpp needs and its tensors
// loom's bytes. (llama.cpp and PyTorch check the files themselves in interop_e2e.py.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "loom/ckpt/gguf.h"
#include "loom/ckpt/safetensors.h"
#include "loom/core/error.h"
#include "loom/data/bpe_files.h"
#include "loom/interop/export.h"
#include "loom/interop/gpt2_layout.h"
#include "loom/interop/model_files.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

std::string fresh(const std::string& name) {
  std::string d = ::testing::TempDir() + "/loom-interop-" + name + "-" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

std::shared_ptr<const data::Gpt2Tokenizer> tok() {
  static auto t = data::Gpt2Tokenizer::load(data::Gpt2Tokenizer::default_vocab_path());
  return t;
}

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

TEST(Safetensors, RoundTripEveryDtypeAndMetadata) {
  const std::string dir = fresh("st");
  fs::create_directories(dir);
  const std::string path = dir + "/a.safetensors";
  std::vector<ckpt::SafetensorsTensor> specs = {
      {"w32", DType::kF32, {3, 5}}, {"w16", DType::kF16, {7}}, {"wbf", DType::kBF16, {2, 2, 2}}};
  auto value = [](size_t t, size_t i) { return 0.25f * static_cast<float>(i) - 1.0f + t; };
  ckpt::write_safetensors(path, specs,
                          [&](size_t t, std::vector<float>& out) {
                            for (size_t i = 0; i < out.size(); ++i) out[i] = value(t, i);
                          },
                          {{"format", "pt"}});
  ckpt::SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 3u);
  for (size_t t = 0; t < specs.size(); ++t) {
    const auto v = f.read_f32(specs[t].name);
    ASSERT_EQ(v.size(), static_cast<size_t>(numel(specs[t].shape)));
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], value(t, i)) << specs[t].name;  // exact
  }
  uint64_t n = 0;
  std::memcpy(&n, read_bytes(path).data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);  // the data starts aligned
  // A write that fails half way leaves the old file as it was and no temporary file.
  const std::string before = read_bytes(path);
  EXPECT_THROW(ckpt::write_safetensors(path, specs,
                                       [](size_t t, std::vector<float>&) {
                                         if (t == 1) throw UserError("disk full", "test");
                                       },
                                       {}),
               UserError);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

// Each lie a damaged or hand-made file can tell is refused by name before any data is read.
TEST(Safetensors, HeadersThatLieAreRefused) {
  const std::string dir = fresh("lies");
  fs::create_directories(dir);
  auto file = [&](const nlohmann::json& header, size_t data_bytes, uint64_t claimed = 0) {
    const std::string text = header.dump();
    uint64_t n = claimed ? claimed : text.size();
    std::string blob(reinterpret_cast<const char*>(&n), 8);
    blob += text + std::string(data_bytes, '\0');
    const std::string p = dir + "/f.safetensors";
    write_bytes(p, blob);
    return p;
  };
  auto refused = [&](const std::string& p, const std::string& needle) {
    try {
      ckpt::SafetensorsFile f(p);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  using J = nlohmann::json;
  const J a = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  const J b = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}};
  EXPECT_NO_THROW(ckpt::SafetensorsFile(file({{"a", a}, {"b", b}}, 16)));
  refused(file({{"a", a}, {"b", b}}, 12), "run past the 12 bytes");  // truncated
  refused(file({{"a", a}, {"b", b}}, 20), "the tensors end at byte 16 of 20");
  refused(
      file({{"a", a}, {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}}, 12),
      "overlaps another");
  refused(
      file({{"a", a}, {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {12, 16}}}}}, 16),
      "(a hole)");
  refused(file({{"a", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}}}, 8),
          "8 bytes for shape [3]");
  refused(file({{"a", {{"dtype", "Q4"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}}, 8),
          "not F32/F16/BF16");
  refused(file({{"a", a}}, 8, 1u << 30), "exceeds the file");
  refused(file(J::array({1, 2}), 0), "not a JSON object");
  fs::remove_all(dir);
}

model::GptConfig small_config() {
  model::GptConfig c;
  c.name = "custom 2x64";
  c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.block_size = 32;
  return c;  // GPT-2's vocabulary, padded to 50304
}

// export_hf -> open_model -> load_params gives back every parameter bit for bit (the padded
// vocabulary rows as the zeros loom keeps there), and the shape from config.json.
TEST(Interop, HuggingFaceExportReadsBackBitForBit) {
  const std::string dir = fresh("hf");
  fs::create_directories(dir);
  model::Gpt m(small_config(), true, {}, false);
  m.init(7);
  // Not just the initialisation's zeros and ones: every element distinct.
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0, 0.3f);
  for (const auto& t : m.tensors())
    for (size_t i = 0; i < t.size; ++i)
      m.params()[t.offset + i] = t.name == "wte" && i >= 50257u * 64 ? 0.0f : nd(g);
  // Write it as a loom checkpoint would name it: a TensorSource over the model.
  struct Source : ckpt::TensorSource {
    model::Gpt& m;
    explicit Source(model::Gpt& m) : m(m) {}
    bool has(const std::string&) const override { return true; }
    Shape shape(const std::string& n) const override {
      for (const auto& t : m.tensors())
        if ("param/" + t.name == n) return t.shape;
      throw InternalError(n);
    }
    void read(const std::string& n, const Shape&, const ckpt::Region& q,
              float* out) const override {
      for (const auto& t : m.tensors())
        if ("param/" + t.name == n) std::copy_n(m.params() + t.offset + q.begin, q.count, out);
    }
  };
  interop::ModelFile src{"memory", "test", m.config(), std::make_shared<Source>(m), nullptr};
  interop::export_hf(src, dir + "/hf", DType::kF32, *tok());
  const interop::ModelFile back = interop::open_model(dir + "/hf");
  EXPECT_EQ(back.config.to_json(), m.config().to_json());
  model::Gpt m2(back.config, true, {}, false);
  interop::load_params(*back.weights, m2);
  ASSERT_EQ(m2.num_params(), m.num_params());
  EXPECT_EQ(std::memcmp(m2.params(), m.params(), m.num_params() * sizeof(float)), 0);
  // The file holds Hugging Face's Conv1D layout: c_attn.weight[i][j] = qkvw[j][i].
  ckpt::SafetensorsFile f(dir + "/hf/model.safetensors");
  const auto cattn = f.read_f32("transformer.h.1.attn.c_attn.weight");
  const float* qkvw = m.param("h1.qkvw");
  EXPECT_EQ(f.find("transformer.h.1.attn.c_attn.weight")->shape, (Shape{64, 192}));
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 192; ++j) ASSERT_EQ(cattn[i * 192 + j], qkvw[j * 64 + i]);
  EXPECT_EQ(f.find("transformer.wte.weight")->shape, (Shape{50257, 64}));
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);  // tied

  // GGUF: what llama.cpp requires, dims as ggml's ne, loom's bytes.
  interop::export_gguf(src, dir + "/m.gguf", DType::kF32, *tok());
  ckpt::GgufFile gf(dir + "/m.gguf");
  EXPECT_EQ(gf.version, 3u);
  EXPECT_EQ(std::get<std::string>(gf.meta.at("general.architecture")), "gpt2");
  EXPECT_EQ(std::get<std::string>(gf.meta.at("tokenizer.ggml.pre")), "gpt-2");
  EXPECT_EQ(std::get<uint32_t>(gf.meta.at("gpt2.feed_forward_length")), 256u);
  EXPECT_EQ(std::get<std::vector<std::string>>(gf.meta.at("tokenizer.ggml.tokens")).size(), 50257u);
  EXPECT_EQ(std::get<std::vector<std::string>>(gf.meta.at("tokenizer.ggml.merges")).size(), 50000u);
  const ckpt::GgufTensor* qkv = nullptr;
  for (const auto& t : gf.tensors)
    if (t.name == "blk.1.attn_qkv.weight") qkv = &t;
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (Shape{192, 64}));  // written as ne = (64, 192)
  std::ifstream in(dir + "/m.gguf", std::ios::binary);
  in.seekg(static_cast<std::streamoff>(gf.data_start + qkv->offset));
  std::vector<float> data(192 * 64);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
  EXPECT_EQ(std::memcmp(data.data(), qkvw, data.size() * 4), 0);
  EXPECT_THROW(interop::export_gguf(src, dir + "/m.gguf", DType::kF32, *tok()), UserError);
  fs::remove_all(dir);
}

// The merges recovered from the ranks re-tokenize every token's bytes to that token.
TEST(Interop, DerivedMergesAreGpt2s) {
  const auto merges = data::derive_merges(*tok());
  ASSERT_EQ(merges.size(), 50000u);
  EXPECT_EQ(data::byte_level_spelling(tok()->token_bytes(merges[0].first) +
                                      tok()->token_bytes(merges[0].second)),
            "Ġt");  // GPT-2's first merge: "Ġ t"
  EXPECT_EQ(data::byte_level_spelling(" \n!\xff"), "ĠĊ!ÿ");
  for (size_t r = 0; r < merges.size(); ++r)
    ASSERT_EQ(tok()->token_bytes(merges[r].first) + tok()->token_bytes(merges[r].second),
              tok()->token_bytes(static_cast<int>(r) + 256));
}

}  // namespace
}  // namespace loom
