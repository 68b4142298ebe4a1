// Element-wise reduction kernels used by every algorithm.
// bf16 and f16 are widened to f32, combined, and rounded once per call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/comm/types.h"
#include "loom/core/dtype.h"

namespace loom::comm {

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b. kAvg combines as kSum;
// the division happens once at the end (finish_avg).
void reduce_into(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

// buf[i] /= n, for ReduceOp::kAvg after the sum has been formed (integers truncate).
void finish_avg(void* buf, size_t count, DType dtype, int n);

// memcpy that skips dst == src (in-place calls).
void copy_bytes(void* dst, const void* src, size_t bytes);

// copy_bytes with non-temporal stores: the destination's lines go to memory without being
// read first and without displacing the cache. For large final outputs, which the copy
// would evict before anyone reads them anyway (PERF-NOTES item 4; docs/perf.md). The
// stores are ordered (sfence) before it returns, so a later release store publishes them.
void copy_streaming(void* dst, const void* src, size_t bytes);
// reduce_into with non-temporal stores for the whole 64-byte lines of dst (same bits; dst
// may alias a or b), for a large reduction's out-of-place output. Ordered before it returns.
void reduce_streaming(void* dst, const void* a, const void* b, size_t count, DType dtype,
                      ReduceOp op);
// Bytes copy_streaming and reduce_streaming have written with non-temporal stores in this process
// (for tests).
uint64_t bytes_streamed();

// LOOM_STREAMING_COPY_MIN: collectives of at least this many bytes write their large plain
// receives with copy_streaming and their large out-of-place reductions with
// reduce_streaming (SIZE_MAX when off). Read when a communicator is built.
size_t streaming_copy_min();

}  // namespace loom::comm
