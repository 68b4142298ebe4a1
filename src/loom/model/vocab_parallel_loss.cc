#include "loom/model/vocab_parallel_loss.h"

#include <cmath>

namespace loom::model {

void vocab_parallel_cross_entropy(kernels::Backend& kb, TpComm& tp, float* logits, float* losses,
                                  const int* targets, int N, VocabShard shard, VocabLossScratch s) {
  const size_t n = static_cast<size_t>(N);
  kb.logits_shard_max(s.max, logits, N, shard.count, shard.valid);
  tp.allreduce_max(s.max, n);
  kb.logits_shard_target(s.target, logits, targets, N, shard.count, shard.begin, shard.valid);
  tp.allreduce_sum(s.target, n);
  kb.softmax_shard_exp(logits, s.sum, s.max, N, shard.count, shard.valid);
  tp.allreduce_sum(s.sum, n);
  kb.softmax_shard_scale(logits, s.sum, N, shard.count, shard.valid);
  for (int i = 0; i < N; ++i) losses[i] = std::log(s.sum[i]) - (s.target[i] - s.max[i]);
}

void vocab_parallel_cross_entropy_backward(kernels::Backend& kb, float* probs, float dloss,
                                           const int* targets, int N, VocabShard shard) {
  kb.crossentropy_shard_backward_inplace(probs, dloss, targets, N, shard.count, shard.begin,
                                         shard.valid);
}

}  // namespace loom::model
