// How a communicator's pairs come to be (Communicator::connect; docs/formats.md "Keys a
// communicator uses", "Connection handshake"):
//
//   1. every rank publishes its host identity, pid and listening address (peer/<rank>) and
//      reads everyone's: the topology (which ranks share a machine) follows;
//   2. shared memory, inside a machine: the lower rank of each pair creates the segment and
//      names it in the store (shm/<i>/<j>), the higher one opens it and unlinks the name;
//   3. TCP, between machines: the lower rank accepts (on a helper thread) and the higher one
//      connects, LOOM_TCP_STREAMS connections per pair, each proving the job token and
//      saying who it is (PairHello) before it is kept.
//
// Steps 2 and 3 run interleaved (create segments, start accepting, connect to lower ranks,
// open lower ranks' segments, join the acceptor) so no rank waits on one that waits on it.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "loom/comm/communicator.h"
#include "loom/comm/net/handshake.h"
#include "loom/comm/net/socket.h"
#include "loom/comm/store/prefix_store.h"
#include "loom/comm/transport/shm/segment.h"
#include "loom/comm/transport/shm/shm_pair.h"
#include "loom/comm/transport/tcp/tcp_pair.h"
#include "loom/core/check.h"
#include "loom/core/checksum.h"
#include "loom/core/cpus.h"
#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {

const DoubleTunable kSpin("LOOM_SPIN_US", 5.0,
                          "microseconds a waiting rank busy-polls before it yields (0 when "
                          "oversubscribed)");
const DoubleTunable kFutexAfter("LOOM_FUTEX_AFTER_US", 1000.0,
                                "microseconds a waiting rank of an oversubscribed host yields "
                                "before it sleeps on its peer's futex (LOOM_SHM_FUTEX)");

constexpr uint32_t kPairHelloMagic = 0x52494150;  // "PAIR"

struct PairHello {
  uint32_t magic;
  int32_t rank;
  uint64_t comm_hash;
  int32_t stream;    // which of the pair's TCP streams this connection is
  int32_t nstreams;  // both sides must agree
};

using Pairs = std::vector<std::unique_ptr<Pair>>;

std::string default_host_id() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot.substr(0, 8);
}

struct PeerInfo {
  std::string host_id;
  int pid = 0;
  std::string addr;
  uint16_t port = 0;
  std::string cpus;  // the rank's affinity mask ("0-3,8"), to count the CPUs its host's ranks have
  size_t shared_from = 0;  // CommConfig::shared_from
};

std::string encode_peer(const PeerInfo& p) {
  return p.host_id + "\t" + std::to_string(p.pid) + "\t" + p.addr + "\t" + std::to_string(p.port) +
         "\t" + p.cpus + "\t" + std::to_string(p.shared_from);
}

PeerInfo decode_peer(const std::string& s) {
  PeerInfo p;
  std::istringstream is(s);
  std::string pid, port, shared_from;
  std::getline(is, p.host_id, '\t');
  std::getline(is, pid, '\t');
  std::getline(is, p.addr, '\t');
  std::getline(is, port, '\t');
  std::getline(is, p.cpus, '\t');
  std::getline(is, shared_from, '\t');
  p.pid = std::atoi(pid.c_str());
  p.shared_from = std::strtoull(shared_from.c_str(), nullptr, 10);
  p.port = static_cast<uint16_t>(std::atoi(port.c_str()));
  return p;
}

// Step 1: every rank's PeerInfo, through the store.
std::vector<PeerInfo> exchange_peers(Store& store, int rank, int size, const PeerInfo& me,
                                     Deadline deadline) {
  store.set("peer/" + std::to_string(rank), encode_peer(me));
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back("peer/" + std::to_string(q));
  store.wait(keys, deadline);
  std::vector<PeerInfo> peers(size);
  for (int q = 0; q < size; ++q) peers[q] = decode_peer(store.get(keys[q], deadline));
  return peers;
}

// Hosts numbered in order of their lowest rank; shared memory with the ranks of this host.
Topology make_topology(const std::vector<PeerInfo>& peers, int rank, bool force_tcp) {
  const int size = static_cast<int>(peers.size());
  Topology t;
  t.size = size;
  t.force_tcp = force_tcp;
  std::map<std::string, int> host_index;
  t.host_of.resize(size);
  for (int q = 0; q < size; ++q) {
    auto [it, fresh] = host_index.emplace(peers[q].host_id, t.nhosts());
    if (fresh) t.hosts.emplace_back();
    t.host_of[q] = it->second;
    t.hosts[it->second].push_back(q);
  }
  t.shm_with.resize(size);
  for (int q = 0; q < size; ++q)
    t.shm_with[q] = q != rank && !force_tcp && t.host_of[q] == t.host_of[rank];
  // Oversubscribed: more ranks on this host than the CPUs they may run on together. Why the
  // union of their masks and not this rank's: a launcher that binds each rank to its own
  // cores (LOOM_BIND=cores, Slurm's --cpu-bind, mpirun --bind-to core) leaves every rank one
  // CPU, and 2 ranks bound to 2 cores were called oversubscribed (no spinning: the 8 MiB
  // allreduce 0.8 -> 4 ms).
  for (const PeerInfo& p : peers) t.cpus.push_back(parse_cpu_list(p.cpus));
  std::set<int> cpus;
  bool known = true;
  for (int q : t.local(rank)) {
    known = known && !t.cpus[q].empty();
    cpus.insert(t.cpus[q].begin(), t.cpus[q].end());
  }
  const int host_cpus = known ? static_cast<int>(cpus.size()) : cpus_available();
  t.oversubscribed = static_cast<int>(t.local(rank).size()) > host_cpus;
  // Shared buffers from the largest of the ranks' sizes on, if every rank has them.
  bool every = true;
  for (const PeerInfo& p : peers) {
    every = every && p.shared_from > 0;
    t.shared_from = std::max(t.shared_from, p.shared_from);
  }
  if (!every) t.shared_from = 0;
  return t;
}

// Step 2, first half: the segments of this rank's pairs with higher local ranks.
void create_shm_pairs(Store& store, int rank, const Topology& topo, size_t ring, Pairs& pairs) {
  for (int q = rank + 1; q < topo.size; ++q) {
    if (!topo.shm_with[q]) continue;
    shm::Segment seg = shm::Segment::create(ShmPair::segment_bytes(ring));
    ShmPair::format(seg, ring);
    // Test hook (multiproc_test's NoSharedMemoryLeftAfterKill): this rank dies here, with a
    // segment made that no peer has opened.
    if (const char* k = std::getenv("LOOM_TEST_KILL_IN_SETUP"); k && std::atoi(k) == rank)
      ::raise(SIGKILL);
    store.set("shm/" + std::to_string(rank) + "/" + std::to_string(q), seg.name());
    pairs[q] = std::make_unique<ShmPair>(rank, q, std::move(seg), 0);
  }
}

// Step 2, second half: the segments lower local ranks made for this one.
void open_shm_pairs(Store& store, int rank, const Topology& topo, Deadline deadline, Pairs& pairs) {
  for (int q = 0; q < rank; ++q) {
    if (!topo.shm_with[q]) continue;
    std::string name = store.get("shm/" + std::to_string(q) + "/" + std::to_string(rank), deadline);
    shm::Segment seg = shm::Segment::open(name);
    seg.unlink();  // both sides have it mapped now; nothing can outlive the job
    pairs[q] = std::make_unique<ShmPair>(rank, q, std::move(seg), 1);
  }
}

// Step 3, the accepting side: a thread that takes `nstreams` authenticated connections from
// each higher rank reached over TCP, refusing what does not belong to this communicator.
class TcpAcceptor {
 public:
  struct Want {
    int rank, size, nstreams, world_rank;
    uint64_t comm_hash;
    std::string token;
    Deadline deadline, handshake_deadline;
  };
  TcpAcceptor(int listener, const Topology& topo, Want w)
      : listener_(listener), w_(std::move(w)), expect_(w_.size, false), accepted_(w_.size) {
    for (auto& v : accepted_) v.resize(w_.nstreams);
    for (int q = w_.rank + 1; q < w_.size; ++q)
      if (!topo.shm_with[q]) expect_[q] = true, expected_ += w_.nstreams;
    thread_ = std::thread([this] { run(); });
  }
  ~TcpAcceptor() {
    if (thread_.joinable()) stop(), thread_.join();
  }
  // Wakes the thread (the connecting side failed): it ends with an error.
  void stop() { ::shutdown(listener_, SHUT_RDWR); }
  // Waits for every connection; the pairs go into `pairs`. Rethrows the thread's failure.
  void finish(Pairs& pairs) {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
    for (int q = 0; q < w_.size; ++q)
      if (expect_[q]) pairs[q] = std::make_unique<TcpPair>(w_.rank, q, std::move(accepted_[q]));
  }

 private:
  void run() {
    try {
      for (int got = 0; got < expected_;) got += accept_one() ? 1 : 0;
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  // One connection: kept (true), or dropped with a warning (false).
  bool accept_one() {
    net::Fd fd = net::accept_one(listener_, w_.deadline);
    if (!fd.valid())
      throw PeerError(PeerError::Kind::kTimeout, "rank " + std::to_string(w_.world_rank) +
                                                     " timed out waiting for peers to connect");
    if (!net::server_handshake(fd.get(), w_.token, "pair", w_.handshake_deadline)) return false;
    PairHello hello{};
    try {
      net::recv_all(fd.get(), &hello, sizeof hello, w_.handshake_deadline, "a connecting peer");
    } catch (const PeerError& e) {
      LOOM_LOG(kWarn, "comm") << "dropped a peer connection before it said hello: " << e.what();
      return false;
    }
    if (hello.magic != kPairHelloMagic || hello.comm_hash != w_.comm_hash || hello.rank < 0 ||
        hello.rank >= w_.size || !expect_[hello.rank] || hello.nstreams != w_.nstreams ||
        hello.stream < 0 || hello.stream >= w_.nstreams ||
        accepted_[hello.rank][hello.stream].valid()) {
      LOOM_LOG(kWarn, "comm") << "refused a peer connection claiming rank " << hello.rank
                              << " stream " << hello.stream << "/" << hello.nstreams
                              << " (not expected on this communicator; LOOM_TCP_STREAMS differs?)";
      return false;
    }
    accepted_[hello.rank][hello.stream] = std::move(fd);
    return true;
  }

  int listener_;
  Want w_;
  std::vector<bool> expect_;
  int expected_ = 0;
  std::vector<std::vector<net::Fd>> accepted_;
  std::exception_ptr error_;
  std::thread thread_;
};

// Step 3, the connecting side: `nstreams` connections to each lower rank reached over TCP.
void connect_tcp_pairs(const std::vector<PeerInfo>& peers, const Topology& topo,
                       const TcpAcceptor::Want& w, Pairs& pairs) {
  for (int q = 0; q < w.rank; ++q) {
    if (topo.shm_with[q]) continue;
    std::string who = "rank " + std::to_string(q);
    std::vector<net::Fd> fds;
    for (int st = 0; st < w.nstreams; ++st) {
      net::Fd fd = net::connect_to({peers[q].addr, peers[q].port}, w.deadline, who);
      net::client_handshake(fd.get(), w.token, "pair", w.handshake_deadline);
      PairHello hello{kPairHelloMagic, w.rank, w.comm_hash, st, w.nstreams};
      net::send_all(fd.get(), &hello, sizeof hello, w.handshake_deadline, who);
      fds.push_back(std::move(fd));
    }
    pairs[q] = std::make_unique<TcpPair>(w.rank, q, std::move(fds));
  }
}

}  // namespace

void Communicator::connect(Deadline deadline) {
  static std::once_flag swept;
  std::call_once(swept, [] { shm::sweep_stale(); });
  if (cfg_.host_id.empty()) cfg_.host_id = default_host_id();
  std::string listen_host = cfg_.listen_host;
  if (listen_host.empty()) listen_host = store_->local_host();
  if (listen_host.empty()) listen_host = "127.0.0.1";
  net::Fd listener = net::listen_on(listen_host, 0);
  const PeerInfo me{cfg_.host_id,
                    static_cast<int>(::getpid()),
                    listen_host,
                    net::local_address(listener.get()).port,
                    format_cpu_list(cpus_allowed()),
                    cfg_.shared_from};
  const std::vector<PeerInfo> peers = exchange_peers(*store_, rank_, size_, me, deadline);
  topo_ = make_topology(peers, rank_, cfg_.transport == "tcp");
  wait_policy_.spin_us = topo_.oversubscribed ? 0 : kSpin.get();
  wait_policy_.futex_after_us = kFutexAfter.get();

  pairs_.resize(size_);
  const TcpAcceptor::Want tcp{rank_,
                              size_,
                              TcpPair::default_streams(),
                              world_ranks_[rank_],
                              fnv1a64(static_cast<PrefixStore&>(*store_).prefix()),
                              cfg_.token,
                              deadline,
                              deadline.earlier(Deadline::after_seconds(30))};
  size_t ring = cfg_.shm_ring_bytes;
  if (ring == 0)
    ring = ShmPair::default_ring_bytes();
  else
    LOOM_CHECK_MSG(ring >= CommConfig::kControlRing && (ring & (ring - 1)) == 0,
                   "CommConfig::shm_ring_bytes: a power of two >= 256 KiB");
  create_shm_pairs(*store_, rank_, topo_, ring, pairs_);
  TcpAcceptor acceptor(listener.get(), topo_, tcp);
  try {
    connect_tcp_pairs(peers, topo_, tcp, pairs_);
    open_shm_pairs(*store_, rank_, topo_, deadline, pairs_);
  } catch (...) {
    acceptor.stop();
    try {
      acceptor.finish(pairs_);  // its own failure is a consequence: report ours
    } catch (...) {
    }
    throw;
  }
  acceptor.finish(pairs_);
  for (int q = 0; q < size_; ++q)
    if (pairs_[q]) pairs_[q]->name_ends(world_ranks_[rank_], world_ranks_[q]);
  for (auto& p : pairs_)
    if (auto* shm = dynamic_cast<ShmPair*>(p.get())) shm->set_futex(topo_.oversubscribed);

  LOOM_LOG(kInfo, "comm") << "communicator '" << cfg_.name << "' rank " << rank_ << "/" << size_
                          << ": " << topo_.describe();
  barrier();  // every pair works before the first user call
}

}  // namespace loom::comm
