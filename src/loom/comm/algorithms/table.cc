#include "loom/comm/algorithms/table.h"

#include <array>

namespace loom::comm::algo {
namespace {

bool pow2_ranks(const Topology& t) {
  return t.size > 0 && (t.size & (t.size - 1)) == 0;
}
bool hierarchical(const Topology& t) {
  return t.hierarchical();
}
bool one_machine(const Topology& t) {
  return t.all_shm();
}

using A = const CollArgs&;
constexpr std::array kTable{
    // allreduce: out = reduce over ranks of in
    AlgoRow{OpKind::kAllreduce, Algo::kRing,
            [](Exec& x, A a) { allreduce_ring(x, a.in, a.out, a.count); }, nullptr},
    AlgoRow{OpKind::kAllreduce, Algo::kRd,
            [](Exec& x, A a) { allreduce_rd(x, a.in, a.out, a.count); }, nullptr},
    AlgoRow{OpKind::kAllreduce, Algo::kDirect,
            [](Exec& x, A a) { allreduce_direct(x, a.in, a.out, a.count); }, nullptr},
    AlgoRow{OpKind::kAllreduce, Algo::kTree,
            [](Exec& x, A a) { allreduce_tree(x, a.in, a.out, a.count); }, nullptr},
    AlgoRow{OpKind::kAllreduce, Algo::kHier,
            [](Exec& x, A a) { allreduce_hier(x, a.in, a.out, a.count); }, hierarchical},
    AlgoRow{OpKind::kAllreduce, Algo::kShared,
            [](Exec& x, A a) { allreduce_shared(x, a.in, a.out, a.count); }, one_machine},
    // allgather(v): block r of out = rank r's in
    AlgoRow{OpKind::kAllgather, Algo::kRing,
            [](Exec& x, A a) { allgather_ring(x, a.in, a.out, *a.blocks); }, nullptr},
    AlgoRow{OpKind::kAllgather, Algo::kDirect,
            [](Exec& x, A a) { allgather_direct(x, a.in, a.out, *a.blocks); }, nullptr},
    AlgoRow{OpKind::kAllgather, Algo::kRd,
            [](Exec& x, A a) { allgather_rd(x, a.in, a.out, *a.blocks); }, pow2_ranks},
    AlgoRow{OpKind::kAllgather, Algo::kHier,
            [](Exec& x, A a) { allgather_hier(x, a.in, a.out, *a.blocks); }, hierarchical},
    // reduce_scatter: out = block `rank` of the reduction
    AlgoRow{OpKind::kReduceScatter, Algo::kRing,
            [](Exec& x, A a) { reduce_scatter_ring(x, a.in, a.out, a.count); }, nullptr},
    AlgoRow{OpKind::kReduceScatter, Algo::kDirect,
            [](Exec& x, A a) { reduce_scatter_direct(x, a.in, a.out, a.count); }, nullptr},
    AlgoRow{OpKind::kReduceScatter, Algo::kRd,
            [](Exec& x, A a) { reduce_scatter_rd(x, a.in, a.out, a.count); }, pow2_ranks},
    AlgoRow{OpKind::kReduceScatter, Algo::kHier,
            [](Exec& x, A a) { reduce_scatter_hier(x, a.in, a.out, a.count); }, hierarchical},
    AlgoRow{OpKind::kReduceScatter, Algo::kShared,
            [](Exec& x, A a) { reduce_scatter_shared(x, a.in, a.out, a.count); }, one_machine},
    // broadcast from root, in place
    AlgoRow{OpKind::kBroadcast, Algo::kTree,
            [](Exec& x, A a) { broadcast_tree(x, a.out, a.bytes, a.root); }, nullptr},
    AlgoRow{OpKind::kBroadcast, Algo::kDirect,
            [](Exec& x, A a) { broadcast_direct(x, a.out, a.bytes, a.root); }, nullptr},
    AlgoRow{OpKind::kBroadcast, Algo::kRing,
            [](Exec& x, A a) { broadcast_ring(x, a.out, a.bytes, a.root); }, nullptr},
    // reduce to root
    AlgoRow{OpKind::kReduce, Algo::kTree,
            [](Exec& x, A a) { reduce_tree(x, a.in, a.out, a.count, a.root); }, nullptr},
    AlgoRow{OpKind::kReduce, Algo::kDirect,
            [](Exec& x, A a) { reduce_direct(x, a.in, a.out, a.count, a.root); }, nullptr},
    // gather / scatter / alltoall: one algorithm each
    AlgoRow{OpKind::kGather, Algo::kDirect,
            [](Exec& x, A a) { gather_direct(x, a.in, a.out, a.bytes, a.root); }, nullptr},
    AlgoRow{OpKind::kScatter, Algo::kDirect,
            [](Exec& x, A a) { scatter_direct(x, a.in, a.out, a.bytes, a.root); }, nullptr},
    AlgoRow{OpKind::kAlltoall, Algo::kDirect,
            [](Exec& x, A a) { alltoall_direct(x, a.in, a.out, a.bytes); }, nullptr},
    AlgoRow{OpKind::kBarrier, Algo::kRd, [](Exec& x, A) { barrier_dissemination(x); }, nullptr},
    AlgoRow{OpKind::kAllgatherShared, Algo::kDirect,
            [](Exec& x, A a) { allgather_shared(x, a.in, a.out, *a.blocks, a.buffer_id); },
            nullptr},
    // Run by the communicator itself (p2p.cc, split, alloc_machine_buffer).
    AlgoRow{OpKind::kSendRecv, Algo::kDirect, nullptr, nullptr},
    AlgoRow{OpKind::kSplit, Algo::kDirect, nullptr, nullptr},
    AlgoRow{OpKind::kMachineBuffer, Algo::kDirect, nullptr, nullptr},
};

}  // namespace

std::span<const AlgoRow> algo_table() {
  return kTable;
}

const AlgoRow* find_algo(OpKind op, Algo a) {
  for (const AlgoRow& r : kTable)
    if (r.op == op && r.algo == a) return &r;
  return nullptr;
}

}  // namespace loom::comm::algo
