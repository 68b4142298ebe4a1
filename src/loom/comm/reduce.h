// Element-wise reduction kernels used by every algorithm.
// bf16 and f16 are widened to f32, combined, and rounded once per call.
#pragma once

#include <cstddef>

#include "loom/comm/types.h"
#include "loom/core/dtype.h"

namespace loom::comm {

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b. kAvg combines as kSum;
// the division happens once at the end (finish_avg).
void reduce_into(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

// buf[i] /= n, for ReduceOp::kAvg after the sum has been formed (integers truncate).
void finish_avg(void* buf, size_t count, DType dtype, int n);

// memcpy that skips dst == src (in-place calls); one function so that a non-temporal
// variant can replace it where that pays off (large final outputs, PERF-NOTES item 4).
void copy_bytes(void* dst, const void* src, size_t bytes);

}  // namespace loom::comm
