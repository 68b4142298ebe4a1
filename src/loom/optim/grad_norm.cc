#include "loom/optim/grad_norm.h"

#include <algorithm>
#include <vector>

namespace loom::optim {

double sum_of_squares(const float* x, size_t n) {
  constexpr size_t kBlock = 1 << 16;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    double s = 0;
    const size_t end = std::min(n, (b + 1) * kBlock);
#pragma omp simd reduction(+ : s)
    for (size_t i = b * kBlock; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[b] = s;
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

}  // namespace loom::optim
