#include "loom/parallel/process_groups.h"

#include <algorithm>

#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::parallel {

namespace {
// The communicator of `members` (this rank among them, or not when empty); every rank of
// the world calls this for each of its groups in the same order. A group is named by its
// first member; a rank's key is its place in the group. shm_ring_bytes: Communicator::split's.
std::shared_ptr<comm::Communicator> group_of(comm::Communicator& world,
                                             const std::vector<int>& members,
                                             size_t shm_ring_bytes = 0) {
  const auto it = std::find(members.begin(), members.end(), world.rank());
  const bool member = it != members.end() && members.size() > 1;
  return world.split(member ? members.front() : -1,
                     member ? static_cast<int>(it - members.begin()) : 0, shm_ring_bytes);
}
}  // namespace

ProcessGroups make_process_groups(std::shared_ptr<comm::Communicator> world, const Mesh& mesh,
                                  const GroupOptions& opt) {
  ProcessGroups g;
  if (!world) return g;
  LOOM_CHECK_EQ(world->size(), mesh.world());
  const int r = world->rank();
  g.world = world;
  g.dp = group_of(*world, mesh.group('D', r));
  g.tp = group_of(*world, mesh.group('T', r));
  // The pipeline group carries the norm's sum only (its stages' transfers have communicators
  // of their own, split from it with the default rings): small rings.
  g.pp = group_of(*world, mesh.group('P', r), comm::CommConfig::kControlRing);
  g.embedding = group_of(*world, mesh.embedding_group(r));
  if (g.dp && opt.shard_within_node && g.dp->topology().nhosts() > 1) {
    const comm::Topology& topo = g.dp->topology();
    for (const auto& h : topo.hosts)
      if (h.size() != topo.hosts[0].size())
        throw UserError("zero.shard_group = node needs the same number of ranks on every machine",
                        "start as many ranks on each machine, or use zero.shard_group = world");
    const int host = topo.host_of[g.dp->rank()];
    const auto& mine = topo.local(g.dp->rank());
    const int local =
        static_cast<int>(std::find(mine.begin(), mine.end(), g.dp->rank()) - mine.begin());
    g.shard = g.dp->split(host, g.dp->rank());
    g.replica = g.dp->split(local, g.dp->rank());
  }
  return g;
}

}  // namespace loom::parallel
