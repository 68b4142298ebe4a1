// The GPT-2 model on the CPU kernels: token + position embeddings, pre-LayerNorm blocks
// (causal multi-head attention, GELU MLP), final LayerNorm, LM head tied to the token
// embedding, vocabulary padded (padded logits excluded from the loss). No parallelism here
// (DESIGN decision 4): ZeRO, tensor and pipeline parallelism act on the units from outside.
//
// Units (DESIGN decision 5): parameters live in one buffer in which each unit is a
// contiguous slice — unit 0 the embeddings (wte (Vp,C), wpe (maxT,C)), units 1..L the blocks,
// unit L+1 the final LayerNorm. Gradients mirror that layout. Inside a block:
//   ln1w ln1b (C) | qkvw (3C,C) qkvb (3C) | attprojw (C,C) attprojb (C) | ln2w ln2b (C)
//   | fcw (4C,C) fcb (4C) | fcprojw (C,4C) fcprojb (C)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::model {

struct GptConfig {
  std::string name = "custom";
  int n_layer = 2, n_head = 2, n_embd = 64, block_size = 64;
  int vocab_size = 50257, padded_vocab_size = 50304;  // padded to a multiple of 128
  // tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m; UserError otherwise.
  static GptConfig named(const std::string& name);
  void validate() const;  // UserError naming the field
};

struct Tensor {  // one named parameter tensor inside the flat buffer
  std::string name;
  size_t offset, size;
  int unit;
  bool decay;  // weight decay applies (matrices and embeddings, not biases or norms)
};

class Gpt {
 public:
  explicit Gpt(GptConfig cfg);
  const GptConfig& config() const { return cfg_; }
  size_t num_params() const { return params_.size(); }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // [begin, end) offsets of unit u's slice.
  std::pair<size_t, size_t> unit_range(int u) const { return units_[u]; }
  int num_units() const { return static_cast<int>(units_.size()); }

  // GPT-2 initialisation: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0,
  // LayerNorm weights 1; deterministic in the seed.
  void init(uint64_t seed);
  // Mean cross-entropy over B*T positions; keeps the activations for backward().
  // targets may be null (inference: logits only, returns 0).
  float forward(const int* tokens, const int* targets, int B, int T);
  // Accumulates d(mean loss)/d(params) into grads() (callers zero_grad() first).
  void backward();
  void zero_grad();
  // (B*T, Vp) logits of the last forward.
  const float* logits() const { return acts_.logits.data(); }

 private:
  struct Acts {
    std::vector<float> encoded, ln1, ln1_mean, ln1_rstd, qkv, atty, preatt, att, attproj, residual2,
        ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3, lnf, lnf_mean, lnf_rstd, logits,
        probs, losses;
  };
  void allocate(int B, int T);
  float* p(int layer, int which);
  float* g(int layer, int which);

  GptConfig cfg_;
  std::vector<float> params_, grads_;
  std::vector<Tensor> tensors_;
  std::vector<std::pair<size_t, size_t>> units_;
  std::vector<size_t> block_offsets_;  // offset of each of a block's 12 tensors within it
  size_t block_size_ = 0;
  Acts acts_, grads_acts_;
  std::vector<int> tokens_, targets_;
  int B_ = 0, T_ = 0;
};

}  // namespace loom::model
