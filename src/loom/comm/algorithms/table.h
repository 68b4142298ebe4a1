// Every collective's algorithms, one row per (operation, algorithm): how to run it and
// where it is valid. The communicator runs a collective through its row; the tuning code
// (tuning.h: valid_algos, choose_algo) chooses among an operation's valid rows, in table
// order (the first is the default when costs tie); `loom bench --algo` and `--calibrate`
// list them from here. Adding an algorithm is its file in algorithms/ and a row here
// (docs/architecture.md "How to add an algorithm").
#pragma once

#include <cstdint>
#include <span>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/topology.h"
#include "loom/comm/types.h"

namespace loom::comm::algo {

// What one call of a collective passes its algorithm (each operation reads its fields).
struct CollArgs {
  const void* in = nullptr;  // broadcast: unused (in place in `out`)
  void* out = nullptr;
  size_t count = 0;                // elements: allreduce, reduce_scatter (per rank), reduce
  size_t bytes = 0;                // bytes: broadcast, gather / scatter / alltoall (per rank)
  const Blocks* blocks = nullptr;  // allgather(v), allgather_shared: each rank's block
  int root = -1;
  uint64_t buffer_id = 0;  // allgather_shared: the machine buffer's id
};

struct AlgoRow {
  OpKind op;
  Algo algo;
  void (*run)(Exec&, const CollArgs&);  // null: an internal operation run by the communicator
  bool (*valid)(const Topology&);       // null: valid everywhere
};

std::span<const AlgoRow> algo_table();
// The row of (op, algo), or null.
const AlgoRow* find_algo(OpKind op, Algo a);

}  // namespace loom::comm::algo
