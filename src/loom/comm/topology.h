// Where the ranks of a communicator live: which share a machine (and so shared memory),
// which reach each other over TCP. Identical on every rank: it is built from what every
// rank published at rendezvous.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace loom::comm {

struct Topology {
  int size = 1;
  std::vector<int> host_of;             // rank -> host index (hosts in order of first rank)
  std::vector<std::vector<int>> hosts;  // host index -> its ranks, ascending
  std::vector<bool> shm_with;           // (filled per rank) peer reachable by shm
  bool force_tcp = false;               // LOOM_TRANSPORT=tcp
  bool oversubscribed = false;          // more ranks on this host than its ranks' CPUs
  std::vector<std::vector<int>> cpus;   // rank -> the CPUs it may run on (as it published them)
  // Every rank puts its buffers of at least this many bytes in shared memory (the largest of
  // the ranks' CommConfig::shared_from, agreed at connect; 0 where any rank passed 0): the
  // shared algorithms need no 1 MiB minimum from there.
  size_t shared_from = 0;

  int nhosts() const { return static_cast<int>(hosts.size()); }
  int max_local() const;
  // Every pair of ranks talks through shared memory.
  bool all_shm() const { return !force_tcp && nhosts() == 1; }
  // Two levels exist: several hosts, and at least one host with several ranks.
  bool hierarchical() const { return nhosts() > 1 && max_local() > 1; }
  int leader_of_host(int h) const { return hosts[h].front(); }
  // Rank r's machine-local ranks (r's own included), ascending.
  const std::vector<int>& local(int r) const { return hosts[host_of[r]]; }
  std::string describe() const;
};

}  // namespace loom::comm
