// The one tuning table: which algorithm runs for (op, bytes, group size, topology).
//
// It is a cost model in the nccl-tests/NCCL sense: each algorithm's time is predicted as
// steps * alpha + bytes_on_the_wire / beta for the links it uses, and `auto` picks the
// smallest prediction among the algorithms valid for the op and group. alpha and beta per
// transport come from LOOM_{SHM,TCP}_{ALPHA_US,GBPS} (defaults measured on the development
// machine with `loom bench`, see docs/algorithms.md and docs/perf.md; an automatic
// `loom bench --calibrate` that fits them is not written yet).
// LOOM_ALGO or the per-call option overrides the choice where that algorithm applies.
#pragma once

#include <cstddef>
#include <vector>

#include "loom/comm/topology.h"
#include "loom/comm/types.h"

namespace loom::comm {

struct LinkCost {
  double alpha_us;  // per message step
  double gbps;      // sustained bytes per ns (GB/s)
};

struct CostModel {
  LinkCost shm;
  LinkCost tcp;
  static CostModel from_env();
};

// Algorithms implemented for `op` that can run on this topology.
std::vector<Algo> valid_algos(OpKind op, const Topology& topo);
double predict_us(OpKind op, Algo algo, size_t bytes, const Topology& topo, const CostModel& m);
// `requested` = kAuto, or an override that is used when valid for this op and topology.
Algo choose_algo(OpKind op, size_t bytes, const Topology& topo, const CostModel& m, Algo requested);

}  // namespace loom::comm
