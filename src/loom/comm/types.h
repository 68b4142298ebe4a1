// Names shared by the communicator, the algorithms and the tuning table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::comm {

enum class ReduceOp : uint8_t { kSum = 0, kAvg, kMin, kMax, kProd, kCount };

enum class OpKind : uint8_t {
  kAllreduce = 0,
  kAllgather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kGather,
  kScatter,
  kAlltoall,
  kBarrier,
  kSendRecv,         // point-to-point
  kSplit,            // internal: the exchange inside split()
  kAllgatherShared,  // allgather into one buffer per machine
  kMachineBuffer,    // internal: alloc_machine_buffer's exchange
  kCount
};

enum class Algo : uint8_t { kAuto = 0, kRing, kDirect, kTree, kRd, kHier, kShared, kCount };

const char* op_name(OpKind op);
const char* reduce_op_name(ReduceOp op);
const char* algo_name(Algo a);
std::optional<Algo> parse_algo(std::string_view s);
std::optional<ReduceOp> parse_reduce_op(std::string_view s);
std::optional<OpKind> parse_op(std::string_view s);

}  // namespace loom::comm
