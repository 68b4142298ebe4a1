// Gradient norms: sums of squares in double precision, so partial sums from shards and
// ranks add up to the norm of the whole gradient.
#pragma once

#include <cstddef>

namespace loom::optim {

// Fixed blocks summed in parallel, then added in block order: the same bits on any thread
// count (an OpenMP reduction combines in arrival order, which would break bit-exact resume).
double sum_of_squares(const float* x, size_t n);

}  // namespace loom::optim
