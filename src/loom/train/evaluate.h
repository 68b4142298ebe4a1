// Scoring a model (`loom eval`, and `eval.task` during training): the loss over a split of a
// prep folder, and multiple-choice tasks in HellaSwag's JSON Lines layout.
//
// Both are written against a function that returns per-position negative log-likelihoods
// of a (B,T) batch, so one process's model and a trainer's parallel layout score the same
// way, and against a rank-major allgather, so work splits over any number of ranks: rank r
// takes batches (items) r, r+W, r+2W, ..., every rank gathers the per-batch (per-choice)
// figures and sums them in batch order. The result is the same bits on 1 rank and on W.
//
// Split loss: sample j of the split is the window [jT, jT+T+1) (the loader's samples,
// data/loader.h), all of them in order, `batch` per forward; loss = mean nats per predicted
// token, perplexity = exp(loss), bits per byte = loss x tokens / text bytes of the split
// / ln 2 (the prep manifest counts both; Gao et al., The Pile, section 3).
//
// Multiple choice (lm-evaluation-harness's way): an item {"ctx", "endings", "label"} scores
// each ending by the summed log-likelihood of the continuation " " + ending after ctx (its
// tokens are those of ctx + " " + ending after the tokens of ctx); acc takes the best sum,
// acc_norm the best sum / the ending's length in characters.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/loader.h"
#include "loom/data/tokenizer.h"

namespace loom::train {

// Writes nll[b*T + t] = -log p(targets[b,t] | tokens[b, 0..t]) for a (B,T) batch.
using NllFn = std::function<void(const int* tokens, const int* targets, int B, int T, float* nll)>;
// Every rank's `mine` (all the same length) concatenated in rank order, on every rank.
using GatherFn = std::function<std::vector<double>(const std::vector<double>& mine)>;

struct SplitLoss {
  double loss = 0;           // mean nats per predicted token
  double perplexity = 0;     // exp(loss)
  double bits_per_byte = 0;  // 0 when the manifest has no byte count
  uint64_t sequences = 0, tokens = 0;
};

// The loss over every sample of `split` in the prep folder `dir` (at most max_sequences of
// them when > 0), `batch` sequences of T tokens per call of nll.
SplitLoss split_loss(const std::string& dir, const std::string& split, int T, int batch,
                     int64_t max_sequences, const NllFn& nll, int rank, int world,
                     const GatherFn& gather);

struct ChoiceItem {
  std::string ctx;
  std::vector<std::string> endings;
  int label = 0;
};

// A task file: one {"ctx": str, "endings": [str, ...], "label": int} per line. UserError
// naming FILE:LINE for a line that is not such an object.
std::vector<ChoiceItem> read_choice_task(const std::string& path);

struct ChoiceScores {
  int64_t items = 0;
  double acc = 0, acc_norm = 0;
  std::vector<std::vector<double>> loglik;  // per item, per ending
};

// Each item as one call of nll: B = the most endings any item has, T = the item's longest
// ctx + ending less one, each sequence truncated on the left to `context` tokens; positions
// past a shorter ending, and rows past the item's endings, are padding nobody reads
// (attention is causal).
ChoiceScores score_choices(const std::vector<ChoiceItem>& items,
                           std::shared_ptr<const data::Gpt2Tokenizer> tok, int context,
                           const NllFn& nll, int rank, int world, const GatherFn& gather);

}  // namespace loom::train
