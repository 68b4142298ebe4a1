// The one tuning table: which algorithm runs for (op, bytes, group size, topology).
//
// It is a cost model in the nccl-tests/NCCL sense: each algorithm's time is predicted as
// steps * alpha + bytes_on_the_wire / beta for the links it uses, and `auto` picks the
// smallest prediction among the algorithms valid for the op and group. alpha and beta per
// transport come from LOOM_{SHM,TCP}_{ALPHA_US,GBPS} (defaults measured on the development
// machine with `loom bench`, see docs/algorithms.md and docs/perf.md). Where a measured
// table is loaded (LOOM_TUNING_FILE, written by `loom bench --calibrate FILE` on the
// machines themselves), its winner for the nearest measured size of the same op and
// topology (hosts, ranks per host, ranks, transport) is used instead of the model.
// LOOM_ALGO or the per-call option overrides the choice where that algorithm applies.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/topology.h"
#include "loom/comm/types.h"

namespace loom::comm {

struct LinkCost {
  double alpha_us;  // per message step
  double gbps;      // sustained bytes per ns (GB/s)
};

// Measured winners (`loom bench --calibrate`): per topology, per op, per size.
struct TuningTable {
  struct Key {
    int nhosts, local, ranks;
    bool force_tcp;
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    OpKind op;
    size_t bytes;
    Algo algo;
    std::map<std::string, double> us;  // every algorithm measured: median time
  };
  std::map<Key, std::vector<Entry>> tables;

  static Key key_of(const Topology& t);
  // The measured winner for op at the nearest measured size (log scale), if this topology
  // and op were measured.
  const Entry* lookup(OpKind op, size_t bytes, const Topology& t) const;
  // JSON file: UserError naming the file on anything malformed.
  static TuningTable load(const std::string& path);
  std::string to_json() const;
};

struct CostModel {
  LinkCost shm;
  LinkCost tcp;
  std::shared_ptr<const TuningTable> measured;  // LOOM_TUNING_FILE, if set
  static CostModel from_env();
};

// Algorithms implemented for `op` that can run on this topology.
std::vector<Algo> valid_algos(OpKind op, const Topology& topo);
double predict_us(OpKind op, Algo algo, size_t bytes, const Topology& topo, const CostModel& m);
// `requested` = kAuto, or an override that is used when valid for this op and topology.
Algo choose_algo(OpKind op, size_t bytes, const Topology& topo, const CostModel& m, Algo requested);

}  // namespace loom::comm
