#include "loom/comm/types.h"

namespace loom::comm {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kAlltoall:
      return "alltoall";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSendRecv:
      return "send/recv";
    case OpKind::kSplit:
      return "split";
    case OpKind::kAllgatherShared:
      return "allgather_shared";
    case OpKind::kMachineBuffer:
      return "machine_buffer";
    case OpKind::kCount:
      break;
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kCount:
      break;
  }
  return "?";
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kAuto:
      return "auto";
    case Algo::kRing:
      return "ring";
    case Algo::kDirect:
      return "direct";
    case Algo::kTree:
      return "tree";
    case Algo::kRd:
      return "rd";
    case Algo::kHier:
      return "hier";
    case Algo::kShared:
      return "shared";
    case Algo::kCount:
      break;
  }
  return "?";
}

std::optional<Algo> parse_algo(std::string_view s) {
  for (int i = 0; i < static_cast<int>(Algo::kCount); ++i)
    if (s == algo_name(static_cast<Algo>(i))) return static_cast<Algo>(i);
  return std::nullopt;
}

std::optional<ReduceOp> parse_reduce_op(std::string_view s) {
  for (int i = 0; i < static_cast<int>(ReduceOp::kCount); ++i)
    if (s == reduce_op_name(static_cast<ReduceOp>(i))) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

std::optional<OpKind> parse_op(std::string_view s) {
  for (int i = 0; i < static_cast<int>(OpKind::kSendRecv); ++i)
    if (s == op_name(static_cast<OpKind>(i))) return static_cast<OpKind>(i);
  if (s == op_name(OpKind::kAllgatherShared)) return OpKind::kAllgatherShared;
  return std::nullopt;
}

}  // namespace loom::comm
