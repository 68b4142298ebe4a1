#include "loom/interop/gpt2_layout.h"

#include <algorithm>

#include "loom/core/check.h"

namespace loom::interop {

namespace {

// out (cols, rows) = in (rows, cols)^T, in cache-sized tiles.
void transpose(const float* in, float* out, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
          out[c * rows + r] = in[r * cols + c];
}

// Rows and columns of a matrix's loom shape ((3,C,C) counts as (3C,C)).
std::pair<int64_t, int64_t> matrix_of(const Shape& s) {
  return {numel(s) / s.back(), s.back()};
}

enum class Naming { kHf, kGguf };

std::vector<MappedTensor> mapped(const model::GptConfig& c, Naming naming) {
  const int64_t C = c.n_embd, V = c.vocab_size, Vp = c.padded_vocab_size, T = c.block_size;
  const bool hf = naming == Naming::kHf;
  std::vector<MappedTensor> out;
  auto add = [&](std::string loom, std::string hf_name, std::string gguf_name, Shape shape,
                 bool matrix, bool cut = false) {
    Shape other = shape;
    if (cut) other[0] = V;
    if (matrix && hf) {
      auto [rows, cols] = matrix_of(shape);
      other = {cols, rows};
    } else if (matrix) {
      auto [rows, cols] = matrix_of(shape);
      other = {rows, cols};
    } else if (shape.size() == 2 && !cut && loom.find("qkvb") != std::string::npos) {
      other = {numel(shape)};
    }
    out.push_back({std::move(loom), hf ? std::move(hf_name) : std::move(gguf_name), shape, other,
                   matrix && hf, cut});
  };
  add("wte", "transformer.wte.weight", "token_embd.weight", {Vp, C}, false, true);
  add("wpe", "transformer.wpe.weight", "position_embd.weight", {T, C}, false);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    const std::string t = "transformer.h." + std::to_string(l) + ".";
    const std::string g = "blk." + std::to_string(l) + ".";
    add(h + "ln1w", t + "ln_1.weight", g + "attn_norm.weight", {C}, false);
    add(h + "ln1b", t + "ln_1.bias", g + "attn_norm.bias", {C}, false);
    add(h + "qkvw", t + "attn.c_attn.weight", g + "attn_qkv.weight", {3, C, C}, true);
    add(h + "qkvb", t + "attn.c_attn.bias", g + "attn_qkv.bias", {3, C}, false);
    add(h + "attprojw", t + "attn.c_proj.weight", g + "attn_output.weight", {C, C}, true);
    add(h + "attprojb", t + "attn.c_proj.bias", g + "attn_output.bias", {C}, false);
    add(h + "ln2w", t + "ln_2.weight", g + "ffn_norm.weight", {C}, false);
    add(h + "ln2b", t + "ln_2.bias", g + "ffn_norm.bias", {C}, false);
    add(h + "fcw", t + "mlp.c_fc.weight", g + "ffn_up.weight", {4 * C, C}, true);
    add(h + "fcb", t + "mlp.c_fc.bias", g + "ffn_up.bias", {4 * C}, false);
    add(h + "fcprojw", t + "mlp.c_proj.weight", g + "ffn_down.weight", {C, 4 * C}, true);
    add(h + "fcprojb", t + "mlp.c_proj.bias", g + "ffn_down.bias", {C}, false);
  }
  add("lnfw", "transformer.ln_f.weight", "output_norm.weight", {C}, false);
  add("lnfb", "transformer.ln_f.bias", "output_norm.bias", {C}, false);
  return out;
}

}  // namespace

std::vector<MappedTensor> hf_tensors(const model::GptConfig& c) {
  return mapped(c, Naming::kHf);
}

std::vector<MappedTensor> gguf_tensors(const model::GptConfig& c) {
  return mapped(c, Naming::kGguf);
}

std::vector<float> to_other(const MappedTensor& t, const std::vector<float>& loom) {
  LOOM_CHECK_EQ(static_cast<int64_t>(loom.size()), numel(t.loom_shape));
  if (t.cut_vocab) return std::vector<float>(loom.begin(), loom.begin() + numel(t.other_shape));
  if (!t.transpose) return loom;
  auto [rows, cols] = matrix_of(t.loom_shape);
  std::vector<float> out(loom.size());
  transpose(loom.data(), out.data(), rows, cols);
  return out;
}

std::vector<float> from_other(const MappedTensor& t, const std::vector<float>& other) {
  LOOM_CHECK_EQ(static_cast<int64_t>(other.size()), numel(t.other_shape));
  if (t.cut_vocab) {
    std::vector<float> out(static_cast<size_t>(numel(t.loom_shape)), 0.0f);
    std::copy(other.begin(), other.end(), out.begin());
    return out;
  }
  if (!t.transpose) return other;
  auto [rows, cols] = matrix_of(t.loom_shape);
  std::vector<float> out(other.size());
  transpose(other.data(), out.data(), cols, rows);
  return out;
}

}  // namespace loom::interop
