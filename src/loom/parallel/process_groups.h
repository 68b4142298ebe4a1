// The communicators of a mesh (parallel/mesh.h), made with the world communicator's split:
// the data-, tensor- and pipeline-parallel groups of this rank and its embedding group.
#pragma once

#include <memory>

#include "loom/comm/communicator.h"
#include "loom/parallel/mesh.h"

namespace loom::parallel {

struct ProcessGroups {
  // Null where the group would hold this rank alone (and `world` for one process).
  std::shared_ptr<comm::Communicator> world, dp, tp, pp, embedding;
  // zero.shard_group = node with a data-parallel group across machines: the dp ranks of
  // this machine (sharded data parallelism shards over them) and the dp ranks of the
  // other machines at the same place in theirs (the replicas, averaged once per step).
  // Null otherwise: shards span the whole dp group.
  std::shared_ptr<comm::Communicator> shard, replica;
};

struct GroupOptions {
  bool shard_within_node = false;  // make `shard` and `replica` (zero.shard_group = node)
};

// Collective over `world` (every rank calls it with the same mesh and options).
ProcessGroups make_process_groups(std::shared_ptr<comm::Communicator> world, const Mesh& mesh,
                                  const GroupOptions& opt = {});

}  // namespace loom::parallel
