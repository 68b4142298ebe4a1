// Cross-entropy over logits split by vocabulary across the tensor-parallel group
// (Megatron's vocab-parallel cross-entropy): the full (N, Vp) logits never exist on a rank.
//
// Forward, per row n, with z this rank's logits (N, Vl):
//   M = allreduce_max(max z over this shard's real columns)
//   z_t = allreduce_sum(z[target] on the rank holding the target, 0 on the others)
//   S = allreduce_sum(sum of e^(z - M) over this shard)
//   loss = log S - (z_t - M);  the logits become the probabilities e^(z - M) / S.
// Exactly three allreduces of N floats. Backward needs no communication:
//   dlogits = (probs - onehot(target)) * dloss on every shard.
#pragma once

#include "loom/kernels/backend.h"
#include "loom/model/tp_comm.h"

namespace loom::model {

struct VocabShard {
  int begin;  // first vocabulary column this rank holds
  int count;  // columns held (Vl)
  int valid;  // of them, real vocabulary (the rest is padding)
};

struct VocabLossScratch {
  float *max, *sum, *target;  // N each
};

// logits (N, shard.count) -> probabilities in place; losses (N).
void vocab_parallel_cross_entropy(kernels::Backend& kb, TpComm& tp, float* logits, float* losses,
                                  const int* targets, int N, VocabShard shard,
                                  VocabLossScratch scratch);
// probs -> dlogits in place (the one exception to the += rule, as on one rank).
void vocab_parallel_cross_entropy_backward(kernels::Backend& kb, float* probs, float dloss,
                                           const int* targets, int N, VocabShard shard);

}  // namespace loom::model
