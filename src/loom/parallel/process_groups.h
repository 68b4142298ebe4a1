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
};

// Collective over `world` (every rank calls it with the same mesh).
ProcessGroups make_process_groups(std::shared_ptr<comm::Communicator> world, const Mesh& mesh);

}  // namespace loom::parallel
