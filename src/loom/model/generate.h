// Text generation (loom sample) with a key/value cache.
//
// Each block's keys and values for every position fed so far stay in the cache, so a new
// token costs one position's forward: the linears on one row per sequence (a batch of
// sequences shares each read of the weights) and attention of that row over the cached
// positions. A prompt is fed at once (prefill), through the training forward's kernels on
// its rows; from an empty cache its attention is the training kernel's causal attention.
//
// The context is block_size positions, and the cache holds that many per sequence. When a
// sequence fills it, the cache restarts from the sequence's last block_size/2 tokens (one
// prefill every block_size/2 new tokens), where full-window generation re-runs block_size
// positions for every token. Inside the window the two compute the same function: the same
// tokens under greedy decoding (tests/unit/generate_test.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "loom/kernels/backend.h"
#include "loom/model/gpt.h"

namespace loom::model {

struct SampleOptions {
  double temperature = 0.8;  // 0: greedy (the most likely token)
  int top_k = 40;            // sample among the k most likely tokens; 0: all
  double top_p = 1.0;        // ... and among the fewest most likely whose probability >= top_p
  uint64_t seed = 1;         // sequence b draws from its own stream, seeded from (seed, b)
  // Decode with bf16 copies of the weight matrices (half the bytes read per token; fp32
  // activations and sums): logits within ~1e-2 of fp32's, so greedy text may differ.
  bool bf16_weights = false;
  void validate() const;  // UserError naming the option
};

// A token drawn from the first V logits under `o`.
int draw_token(const float* logits, int V, const SampleOptions& o, std::mt19937_64& rng);

class KvDecoder {
 public:
  // The model must be whole (no tensor split) and own its parameters; it is only read.
  // With bf16_weights, few-row products read bf16 copies of the matrices made here.
  KvDecoder(const Gpt& model, int batch, bool bf16_weights = false);
  int batch() const { return static_cast<int>(len_.size()); }
  int capacity() const { return cfg_.block_size; }
  int length(int b) const { return len_[b]; }  // positions of sequence b in the cache
  void reset(int b) { len_[b] = 0; }
  // Appends tokens[0..n) to sequence b (n <= capacity() - length(b)); returns the logits
  // (Vp) after the last of them, in memory() (host memory on the CPU backends).
  const float* prefill(int b, const int* tokens, int n);
  // Appends tokens[i] to sequence seqs[i] for each i (each with room); returns the logits
  // (seqs.size(), Vp) after each.
  const float* step(const std::vector<int>& seqs, const int* tokens);
  // Where the cache, the scratch and the logits live (the backend's).
  const std::shared_ptr<kernels::Memory>& memory() const { return mem_; }

 private:
  // The forward of R rows (row r: token tok[r] at position pos[r] of sequence seq[r]) whose
  // keys and values join the cache; logits of the rows listed in `out_rows`.
  const float* forward(int R, const int* seq, const int* pos, const int* tok,
                       const std::vector<int>& out_rows);
  void linear(float* out, const float* inp, const float* w, const float* b, int R, int C, int OC);
  static constexpr int kFewRows = 16;

  GptConfig cfg_;
  const Gpt& model_;
  const float *wte_, *wpe_, *lnfw_, *lnfb_;    // (Vp,C), (block_size,C), the final norm's
  std::unique_ptr<kernels::Backend> backend_;  // the model's kind, in fp32
  std::shared_ptr<kernels::Memory> mem_;       // backend_'s: everything below but len_, seq_, pos_
  std::unordered_map<const float*, kernels::Buffer<uint16_t>> bf16_;  // matrix -> bf16 copy
  std::vector<int> len_;
  std::vector<Floats> k_, v_;  // per layer (batch, NH, block_size, hs)
  // Scratch for up to block_size rows.
  Floats x_, ln_, mean_, rstd_, qkv_, atty_, proj_, fch_, gelu_, att_, logits_;
  std::vector<int> seq_, pos_;           // the host's
  kernels::Buffer<int> rows_[4];         // the rows' sequences, positions, tokens, cached lengths
  kernels::Buffer<const float*> kv_[2];  // each row's sequence's keys and values
};

struct GenerateStats {
  double first_token_s = 0;  // to every prompt's first new token (the prompts' forward)
  double total_s = 0;
};

// Up to max_new tokens after each prompt (a sequence stops before <|endoftext|> = eot).
// With cache = false each token re-runs the last block_size tokens through Gpt::forward
// (the reference the cache is tested against, and `loom sample --no-cache`).
std::vector<std::vector<int>> generate(Gpt& model, const std::vector<std::vector<int>>& prompts,
                                       int max_new, const SampleOptions& o, bool cache, int eot,
                                       GenerateStats* stats = nullptr);

}  // namespace loom::model
