#include "loom/comm/communicator.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <sstream>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/flight_recorder.h"
#include "loom/comm/net/handshake.h"
#include "loom/comm/net/socket.h"
#include "loom/comm/reduce.h"
#include "loom/comm/store/prefix_store.h"
#include "loom/comm/transport/shm/segment.h"
#include "loom/comm/transport/shm/shared_memory.h"
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

const DoubleTunable kTimeout("LOOM_TIMEOUT_S", 300.0,
                             "deadline of every blocking communication call, seconds");
const StringTunable kTransport("LOOM_TRANSPORT", "auto",
                               "auto (shm inside a host, TCP across) or tcp (TCP everywhere)");
const StringTunable kHostId("LOOM_HOST_ID", "",
                            "override this process's host identity (tests place ranks on "
                            "virtual hosts)");
const StringTunable kAddr("LOOM_ADDR", "",
                          "address to listen on for peers (default: the one that reaches the "
                          "store)");
const StringTunable kToken("LOOM_JOB_TOKEN", "", "per-job secret proven by every connection");
const StringTunable kAlgo("LOOM_ALGO", "auto", "force an algorithm: auto|ring|direct|tree|rd|hier");
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
};

std::string encode_peer(const PeerInfo& p) {
  return p.host_id + "\t" + std::to_string(p.pid) + "\t" + p.addr + "\t" + std::to_string(p.port);
}

PeerInfo decode_peer(const std::string& s) {
  PeerInfo p;
  std::istringstream is(s);
  std::string pid, port;
  std::getline(is, p.host_id, '\t');
  std::getline(is, pid, '\t');
  std::getline(is, p.addr, '\t');
  std::getline(is, port, '\t');
  p.pid = std::atoi(pid.c_str());
  p.port = static_cast<uint16_t>(std::atoi(port.c_str()));
  return p;
}

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "?";
}

}  // namespace

CommConfig CommConfig::from_env() {
  CommConfig c;
  c.timeout_s = kTimeout.get();
  if (c.timeout_s <= 0)
    throw UserError("LOOM_TIMEOUT_S must be positive", "set a number of seconds, e.g. 300");
  c.transport = kTransport.get();
  if (c.transport != "auto" && c.transport != "tcp")
    throw UserError("LOOM_TRANSPORT='" + c.transport + "' is not a transport", "use auto or tcp");
  c.host_id = kHostId.get();
  c.listen_host = kAddr.get();
  c.token = kToken.get();
  auto a = parse_algo(kAlgo.get());
  if (!a)
    throw UserError("LOOM_ALGO='" + kAlgo.get() + "' is not an algorithm",
                    "use auto, ring, direct, tree, rd or hier");
  c.algo = *a;
  c.model = CostModel::from_env();
  return c;
}

// ------------------------------------------------------------------ setup

Communicator::Communicator(std::shared_ptr<Store> root_store, std::shared_ptr<Store> store,
                           int rank, int size, CommConfig cfg)
    : root_store_(std::move(root_store)),
      store_(std::move(store)),
      rank_(rank),
      size_(size),
      cfg_(std::move(cfg)),
      equal_blocks_(std::make_unique<algo::Blocks>()) {
  if (size < 1 || rank < 0 || rank >= size)
    throw UserError(
        "rank " + std::to_string(rank) + " is not valid for world size " + std::to_string(size),
        "ranks run from 0 to size-1 (LOOM_RANK, LOOM_WORLD_SIZE)");
  watch_store_ = root_store_->clone();
  name_ = std::make_shared<const std::string>(cfg_.name);
  world_ranks_.resize(size);
  for (int q = 0; q < size; ++q) world_ranks_[q] = q;  // a split maps them to the world's
  p2p_send_seq_.assign(size, 0);
  p2p_recv_seq_.assign(size, 0);
}

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommConfig cfg) {
  auto ns = std::make_shared<PrefixStore>(cfg.name, std::move(store));
  std::shared_ptr<Communicator> c(new Communicator(ns, ns, rank, size, std::move(cfg)));
  c->connect(Deadline::after_seconds(c->cfg_.timeout_s));
  start_watchdog(c->root_store_->clone(), rank, size);  // once per process
  return c;
}

void Communicator::connect(Deadline deadline) {
  static std::once_flag swept;
  std::call_once(swept, [] { shm::sweep_stale(); });
  if (cfg_.host_id.empty()) cfg_.host_id = default_host_id();
  std::string listen_host = cfg_.listen_host;
  if (listen_host.empty()) listen_host = store_->local_host();
  if (listen_host.empty()) listen_host = "127.0.0.1";

  net::Fd listener = net::listen_on(listen_host, 0);
  PeerInfo me{cfg_.host_id, static_cast<int>(::getpid()), listen_host,
              net::local_address(listener.get()).port};
  store_->set("peer/" + std::to_string(rank_), encode_peer(me));
  std::vector<std::string> keys;
  for (int q = 0; q < size_; ++q) keys.push_back("peer/" + std::to_string(q));
  store_->wait(keys, deadline);
  std::vector<PeerInfo> peers(size_);
  for (int q = 0; q < size_; ++q) peers[q] = decode_peer(store_->get(keys[q], deadline));

  // Topology: hosts numbered in order of their lowest rank.
  topo_.size = size_;
  topo_.force_tcp = cfg_.transport == "tcp";
  std::map<std::string, int> host_index;
  topo_.host_of.resize(size_);
  for (int q = 0; q < size_; ++q) {
    auto [it, fresh] = host_index.emplace(peers[q].host_id, topo_.nhosts());
    if (fresh) topo_.hosts.emplace_back();
    topo_.host_of[q] = it->second;
    topo_.hosts[it->second].push_back(q);
  }
  topo_.shm_with.resize(size_);
  for (int q = 0; q < size_; ++q)
    topo_.shm_with[q] = q != rank_ && !topo_.force_tcp && topo_.host_of[q] == topo_.host_of[rank_];
  topo_.oversubscribed = static_cast<int>(topo_.local(rank_).size()) > cpus_available();
  wait_policy_.spin_us = topo_.oversubscribed ? 0 : kSpin.get();
  wait_policy_.futex_after_us = kFutexAfter.get();

  pairs_.resize(size_);
  const std::string my_name = static_cast<PrefixStore&>(*store_).prefix();
  const uint64_t comm_hash = fnv1a64(my_name);
  Deadline hs_deadline = deadline.earlier(Deadline::after_seconds(30));

  // 1. Shared-memory segments this rank creates (for higher local ranks).
  size_t ring = ShmPair::default_ring_bytes();
  for (int q = rank_ + 1; q < size_; ++q) {
    if (!topo_.shm_with[q]) continue;
    shm::Segment seg = shm::Segment::create(ShmPair::segment_bytes(ring));
    ShmPair::format(seg, ring);
    store_->set("shm/" + std::to_string(rank_) + "/" + std::to_string(q), seg.name());
    pairs_[q] = std::make_unique<ShmPair>(rank_, q, std::move(seg), 0);
  }

  // 2. Accept TCP connections (nstreams per peer) from higher ranks on a helper thread.
  const int nstreams = TcpPair::default_streams();
  std::vector<bool> expect(size_, false);
  int expected = 0;
  for (int q = rank_ + 1; q < size_; ++q)
    if (!topo_.shm_with[q]) expect[q] = true, expected += nstreams;
  std::vector<std::vector<net::Fd>> accepted(size_);
  for (auto& v : accepted) v.resize(nstreams);
  std::exception_ptr accept_error;
  std::thread acceptor([&] {
    try {
      int got = 0;
      while (got < expected) {
        net::Fd fd = net::accept_one(listener.get(), deadline);
        if (!fd.valid())
          throw PeerError(PeerError::Kind::kTimeout, "rank " + std::to_string(world_ranks_[rank_]) +
                                                         " timed out waiting for peers to connect");
        if (!net::server_handshake(fd.get(), cfg_.token, "pair", hs_deadline)) continue;
        PairHello hello{};
        try {
          net::recv_all(fd.get(), &hello, sizeof hello, hs_deadline, "a connecting peer");
        } catch (const PeerError& e) {
          LOOM_LOG(kWarn, "comm") << "dropped a peer connection before it said hello: " << e.what();
          continue;
        }
        if (hello.magic != kPairHelloMagic || hello.comm_hash != comm_hash || hello.rank < 0 ||
            hello.rank >= size_ || !expect[hello.rank] || hello.nstreams != nstreams ||
            hello.stream < 0 || hello.stream >= nstreams ||
            accepted[hello.rank][hello.stream].valid()) {
          LOOM_LOG(kWarn, "comm")
              << "refused a peer connection claiming rank " << hello.rank << " stream "
              << hello.stream << "/" << hello.nstreams
              << " (not expected on this communicator; LOOM_TCP_STREAMS differs?)";
          continue;
        }
        accepted[hello.rank][hello.stream] = std::move(fd);
        ++got;
      }
    } catch (...) {
      accept_error = std::current_exception();
    }
  });

  // 3. Connect to lower TCP peers, 4. open lower ranks' shared-memory segments.
  std::exception_ptr connect_error;
  try {
    for (int q = 0; q < rank_; ++q) {
      if (topo_.shm_with[q]) continue;
      std::string who = "rank " + std::to_string(q);
      std::vector<net::Fd> fds;
      for (int st = 0; st < nstreams; ++st) {
        net::Fd fd = net::connect_to({peers[q].addr, peers[q].port}, deadline, who);
        net::client_handshake(fd.get(), cfg_.token, "pair", hs_deadline);
        PairHello hello{kPairHelloMagic, rank_, comm_hash, st, nstreams};
        net::send_all(fd.get(), &hello, sizeof hello, hs_deadline, who);
        fds.push_back(std::move(fd));
      }
      pairs_[q] = std::make_unique<TcpPair>(rank_, q, std::move(fds));
    }
    for (int q = 0; q < rank_; ++q) {
      if (!topo_.shm_with[q]) continue;
      std::string name =
          store_->get("shm/" + std::to_string(q) + "/" + std::to_string(rank_), deadline);
      shm::Segment seg = shm::Segment::open(name);
      seg.unlink();  // both sides have it mapped now; nothing can outlive the job
      pairs_[q] = std::make_unique<ShmPair>(rank_, q, std::move(seg), 1);
    }
  } catch (...) {
    connect_error = std::current_exception();
    ::shutdown(listener.get(), SHUT_RDWR);
  }
  acceptor.join();
  if (connect_error) std::rethrow_exception(connect_error);
  if (accept_error) std::rethrow_exception(accept_error);
  for (int q = 0; q < size_; ++q)
    if (expect[q]) pairs_[q] = std::make_unique<TcpPair>(rank_, q, std::move(accepted[q]));
  for (int q = 0; q < size_; ++q)
    if (pairs_[q]) pairs_[q]->name_ends(world_ranks_[rank_], world_ranks_[q]);
  for (auto& p : pairs_)
    if (auto* shm = dynamic_cast<ShmPair*>(p.get())) shm->set_futex(topo_.oversubscribed);

  LOOM_LOG(kInfo, "comm") << "communicator '" << cfg_.name << "' rank " << rank_ << "/" << size_
                          << ": " << topo_.describe();
  barrier();  // every pair works before the first user call
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  std::vector<int64_t> mine{color, key}, all(2 * static_cast<size_t>(size_));
  Op op;
  op.fp = {OpKind::kSplit, DType::kI64, ReduceOp::kSum, Algo::kDirect, -1, 2};
  op.body = [&](Exec& x) {
    algo::allgather_direct(x, mine.data(), all.data(), algo::even_blocks(2 * size_, size_, 8));
  };
  submit(std::move(op), true);
  int index = splits_++;
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int q = 0; q < size_; ++q)
    if (all[2 * q] == color) members.push_back(q);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  std::string sub = "split" + std::to_string(index) + "/c" + std::to_string(color);
  CommConfig cfg = cfg_;
  cfg.name = cfg_.name + "/" + sub;
  auto ns = std::make_shared<PrefixStore>(sub, store_);
  std::shared_ptr<Communicator> c(
      new Communicator(root_store_, ns, new_rank, static_cast<int>(members.size()), cfg));
  for (size_t i = 0; i < members.size(); ++i) c->world_ranks_[i] = world_ranks_[members[i]];
  c->connect(Deadline::after_seconds(cfg.timeout_s));
  return c;
}

// ------------------------------------------------------------------ shared buffers

SharedBuffer::SharedBuffer(size_t bytes) : data_(shm::shared_alloc(bytes)), bytes_(bytes) {}

SharedBuffer& SharedBuffer::operator=(SharedBuffer&& o) noexcept {
  if (this != &o) {
    shm::shared_free(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

SharedBuffer::~SharedBuffer() {
  shm::shared_free(data_);
}

MachineBuffer& MachineBuffer::operator=(MachineBuffer&& o) noexcept {
  if (this != &o) {
    if (mapped_) shm::unmap_peer_buffer(data_, bytes_);
    own_ = std::move(o.own_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    id_ = std::exchange(o.id_, 0);
    sharers_ = std::exchange(o.sharers_, 1);
    mapped_ = std::exchange(o.mapped_, false);
  }
  return *this;
}

MachineBuffer::~MachineBuffer() {
  if (mapped_) shm::unmap_peer_buffer(data_, bytes_);
}

MachineBuffer Communicator::alloc_machine_buffer(size_t bytes) {
  const std::vector<int>& local = topo_.local(rank_);
  const bool first = local.front() == rank_;
  MachineBuffer m;
  m.bytes_ = bytes;
  m.sharers_ = static_cast<int>(local.size());
  struct Ref {
    int64_t pid = 0, fd = -1;
    uint64_t id = 0;
  } ref;
  if (first) {
    m.own_ = SharedBuffer(bytes);
    shm::SharedRef sr;
    LOOM_CHECK(shm::shared_find(m.own_.data(), bytes, &sr));
    ref = {::getpid(), sr.fd, sr.id};
    m.data_ = m.own_.data();
  }
  // The machine's first rank names its buffer to the others, which map it.
  std::string why;
  Op op;
  op.fp = {OpKind::kMachineBuffer, DType::kU8, ReduceOp::kSum, Algo::kDirect, -1, bytes};
  op.body = [&](Exec& x) {
    if (first) {
      for (size_t i = 1; i < local.size(); ++i) x.send(local[i], &ref, sizeof ref);
    } else {
      x.recv(local.front(), &ref, sizeof ref);
    }
    x.wait_all();
  };
  submit(std::move(op), true);
  m.id_ = ref.id;
  if (!first) {
    m.data_ = shm::map_peer_buffer(static_cast<int>(ref.pid),
                                   {ref.id, static_cast<int32_t>(ref.fd)}, bytes, &why);
    m.mapped_ = m.data_ != nullptr;
  }
  // Every rank learns whether every rank could map it, so all of them fail together.
  int64_t ok = first || m.mapped_ ? 1 : 0, all_ok = 0;
  allreduce(&ok, &all_ok, 1, DType::kI64, ReduceOp::kMin);
  if (all_ok == 1) return m;
  if (!ok)
    throw Error("rank " + std::to_string(rank_) + " of '" + cfg_.name +
                "' cannot map the machine buffer of rank " + std::to_string(local.front()) + ": " +
                why +
                "; ranks of one machine must be able to open each other's /proc/PID/fd (same "
                "user; ptrace policy); turn the shared gather off (zero.shared_gather = off)");
  throw Error("a rank of '" + cfg_.name +
              "' could not map its machine's shared buffer (its log names the cause); "
              "turn the shared gather off (zero.shared_gather = off)");
}

StateSource* shared_state_source() {
  struct Source final : StateSource {
    void* allocate(size_t bytes) override { return shm::shared_alloc(bytes); }
    void deallocate(void* p) override { shm::shared_free(p); }
  };
  static Source source;
  return &source;
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

// ------------------------------------------------------------------ execution

Algo Communicator::chosen_algo(OpKind op, size_t bytes, Algo requested) const {
  if (requested == Algo::kAuto) requested = cfg_.algo;
  // The choice depends only on (op, bytes, requested) once connected: the last one per op
  // is kept (a training step repeats its sizes; choose_algo builds a vector and a model).
  const bool cacheable =
      bytes < (uint64_t{1} << 47) && static_cast<size_t>(op) < algo_cache_.size();
  const uint64_t tag = (uint64_t{bytes} << 16) | (uint64_t{static_cast<uint8_t>(requested)} << 8);
  if (cacheable) {
    const uint64_t c = algo_cache_[static_cast<size_t>(op)].load(std::memory_order_relaxed);
    if ((c & ~uint64_t{0xff}) == tag && (c & 0x80)) return static_cast<Algo>(c & 0x7f);
  }
  const Algo a = choose_algo(op, bytes, topo_, cfg_.model, requested);
  if (cacheable)
    algo_cache_[static_cast<size_t>(op)].store(tag | 0x80 | static_cast<uint8_t>(a),
                                               std::memory_order_relaxed);
  return a;
}

bool Communicator::run_inline(Op& op, Body body) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_ || running_ || !queue_.empty()) return false;  // submit says why / queues
    running_ = true;
    op.seq = next_seq_++;
  }
  op.record = FlightRecorder::kNoRecord;
  std::exception_ptr err;
  try {
    run(op, body, true);
  } catch (...) {
    err = std::current_exception();
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    wake = !queue_.empty();  // another thread queued meanwhile: the worker waits for us
  }
  if (wake) cv_.notify_all();
  if (err) std::rethrow_exception(err);
  return true;
}

WorkPtr Communicator::submit(Op op, bool blocking) {
  op.work = std::make_shared<Work>();
  WorkPtr work = op.work;
  std::unique_lock<std::mutex> lock(mu_);
  if (broken_) {
    work->finish(std::make_exception_ptr(
        PeerError(PeerError::Kind::kAborted,
                  "rank " + std::to_string(world_ranks_[rank_]) + ": communicator '" + cfg_.name +
                      "' is unusable after an earlier failure: " + what_of(broken_) +
                      " (create a new communicator to recover)")));
    lock.unlock();
    if (blocking) work->wait();
    return work;
  }
  // A receive takes its sequence number when it is posted (run_p2p), in queue order: one
  // from any source learns its peer only then.
  const bool p2p = op.p2p_peer != kNoPeer;
  if (p2p && op.p2p_send)
    op.seq = p2p_send_seq_[op.p2p_peer]++;
  else if (!p2p)
    op.seq = next_seq_++;
  const size_t bytes = op.fp.count * dtype_size(op.fp.dtype);
  const int peer = op.p2p_peer >= 0 ? world_ranks_[op.p2p_peer] : -1;
  if (blocking && queue_.empty() && !running_) {
    // The latency path: run on the caller's thread.
    running_ = true;
    lock.unlock();
    op.record = FlightRecorder::get().queued(name_, op.seq, op.fp, bytes, true, peer, op.p2p_send);
    if (p2p) {
      run_p2p(std::move(op), true);
      lock.lock();
      running_ = false;
      lock.unlock();
      cv_.notify_all();
      work->wait();  // rethrows its error
      return work;
    }
    std::exception_ptr err;
    try {
      run(op, op.body, true);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    running_ = false;
    lock.unlock();
    cv_.notify_all();
    work->finish(err);
    if (err) std::rethrow_exception(err);
    return work;
  }
  op.record = FlightRecorder::get().queued(name_, op.seq, op.fp, bytes, false, peer, op.p2p_send);
  queue_.push_back(std::move(op));
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  lock.unlock();
  cv_.notify_all();
  if (blocking) work->wait();
  return work;
}

void Communicator::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return (stop_ && queue_.empty()) || (!queue_.empty() && !running_); });
    if (queue_.empty()) return;
    Op op = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    std::exception_ptr err = broken_;
    lock.unlock();
    if (err) FlightRecorder::get().finished(op.record, false);
    if (!err && op.p2p_peer != kNoPeer) {
      run_p2p(std::move(op), false);  // finishes the works itself
    } else if (!err) {
      try {
        run(op, op.body);
      } catch (...) {
        err = std::current_exception();
      }
    }
    if (op.work) op.work->finish(err);  // (moved out by run_p2p)
    lock.lock();
    running_ = false;
    cv_.notify_all();
  }
}

void Communicator::check_abort() {
  std::string key = "abort";
  if (!watch_store_->check({key})) return;
  std::string why = watch_store_->get(key, Deadline::after_seconds(10));
  throw PeerError(PeerError::Kind::kAborted, "the job was aborted: " + why);
}

void Communicator::fail(const Op& op, const std::exception& e) {
  for (auto& p : pairs_)
    if (p) p->cancel_all();
  const auto* pe = dynamic_cast<const PeerError*>(&e);
  PeerError::Kind kind = pe ? pe->kind() : PeerError::Kind::kProtocol;
  int peer = pe ? pe->peer() : -1;
  std::string where = "rank " + std::to_string(world_ranks_[rank_]) + ": " + op.fp.str() +
                      " at sequence number " + std::to_string(op.seq) + " on communicator '" +
                      cfg_.name + "' failed: ";
  std::string msg = where + e.what();
  if (kind != PeerError::Kind::kAborted) {
    // Another rank may have failed first and exited: its departure is what we saw. Report
    // the first failure of the job (the root cause) rather than our secondary symptom.
    try {
      std::string first = watch_store_->compare_set("abort", "", msg);
      if (first != msg) {
        kind = PeerError::Kind::kAborted;
        msg = where + "the job was aborted: " + first + " (seen here as: " + e.what() + ")";
      }
    } catch (const std::exception& se) {
      LOOM_LOG(kWarn, "comm") << "could not reach the store to post the abort record: "
                              << se.what();
    }
  }
  {
    // The flight recorder's last operations of this process, for the post-mortem.
    std::string lines;
    const double now = FlightRecorder::now_s();
    for (const auto& e : FlightRecorder::get().last(4))
      lines += "\n  " + FlightRecorder::describe(e, now);
    LOOM_LOG(kWarn, "comm") << "rank " << rank_ << " of '" << cfg_.name
                            << "', its last operations:" << lines;
  }
  PeerError err(kind, msg, peer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) broken_ = std::make_exception_ptr(err);
  }
  throw err;
}

void Communicator::run(Op& op, Body body, bool on_caller) {
  double t = op.timeout_s > 0 ? op.timeout_s : cfg_.timeout_s;
  FlightRecorder& rec = FlightRecorder::get();
  if (!on_caller) rec.started(op.record);
  // Not entered yet (run_inline): it is, as running, once it has waited ~100 ms (where the
  // watchdog and a hang report look), else in one step when it ends.
  const double start_s = op.record == FlightRecorder::kNoRecord ? FlightRecorder::now_s() : 0;
  const size_t bytes = op.fp.count * dtype_size(op.fp.dtype);
  // Every 100 ms of waiting: a recorded root cause first, then whom we wait for (the
  // flight recorder shows it in a hang report). One pointer captured: std::function keeps
  // it without allocating, on the latency path too.
  struct Waiting {
    Communicator* c;
    const Exec* x;
    Op* op;
    double start_s;
    size_t bytes;
  } w{this, nullptr, &op, start_s, bytes};
  Exec x(
      rank_, size_, pairs_, topo_, op.fp, op.seq, Deadline::after_seconds_coarse(t), wait_policy_,
      [&w] {
        w.c->check_abort();
        if (!w.x) return;
        FlightRecorder& rec = FlightRecorder::get();
        Op& op = *w.op;
        if (op.record == FlightRecorder::kNoRecord)
          op.record = rec.queued(w.c->name_, op.seq, op.fp, w.bytes, true, -1, false, w.start_s);
        std::vector<int> who;
        for (int q : w.x->busy_peers()) who.push_back(w.c->world_ranks_[q]);
        rec.waiting(op.record, std::move(who));
      },
      scratch_, queues_);
  w.x = &x;
  auto record_end = [&](bool ok) {
    if (op.record == FlightRecorder::kNoRecord)
      rec.record_done(name_, op.seq, op.fp, bytes, start_s, ok);
    else
      rec.finished(op.record, ok);
  };
  try {
    body(x);
  } catch (const std::exception& e) {
    record_end(false);
    const auto* pe = dynamic_cast<const PeerError*>(&e);
    if (pe || dynamic_cast<const InternalError*>(&e)) fail(op, e);
    throw;
  }
  record_end(true);
}

void Communicator::run_p2p(Op first, bool on_caller) {
  // Sends and receives progress together: every one at the front of the queue is posted at
  // once, and more are taken from the queue while these run, so that two ranks that each
  // post a receive and then a send to the other (torch's batch_isend_irecv) both complete.
  // Each finishes its own work as soon as its transfer is done. A receive from any source
  // is matched to the first pair whose next incoming message is the send it expects; the
  // receives queued behind it wait until it is (messages of a pair arrive in order).
  FlightRecorder& rec = FlightRecorder::get();
  std::list<Op> live;
  Exec x(
      rank_, size_, pairs_, topo_, first.fp, first.seq, Deadline::never(), wait_policy_,
      [&] {
        check_abort();
        if (live.empty()) return;
        std::vector<int> who;
        for (auto& p : pairs_)
          if (p && p->busy()) who.push_back(world_ranks_[p->peer()]);
        rec.waiting(live.front().record, std::move(who));
      },
      scratch_, queues_);
  bool unmatched = false;  // a receive from any source is waiting for its sender
  auto post = [&](Op& op) {
    op.deadline = Deadline::after_seconds(op.timeout_s > 0 ? op.timeout_s : cfg_.timeout_s);
    if (op.p2p_send) {
      x.set_op(op.fp, op.seq);
      op.sreq = x.send(op.p2p_peer, op.p2p_buf, op.p2p_bytes);
    } else if (op.p2p_peer >= 0) {
      op.seq = p2p_recv_seq_[op.p2p_peer]++;
      rec.matched(op.record, op.seq, world_ranks_[op.p2p_peer]);
      x.set_op(op.fp, op.seq);
      op.rreq = x.recv(op.p2p_peer, op.p2p_buf, op.p2p_bytes);
    } else {
      unmatched = true;
    }
  };
  live.push_back(std::move(first));
  if (!on_caller) rec.started(live.back().record);
  post(live.back());
  x.set_deadline(live.back().deadline);
  int next_peer = 0;  // where the search for an any-source sender starts (round robin)
  auto step = [&]() -> bool {
    bool changed = false;
    // Match receives from any source, oldest first.
    if (unmatched) {
      unmatched = false;
      for (Op& op : live) {
        if (op.p2p_peer != kAnyPeer) continue;
        for (int i = 0; i < size_ && op.p2p_peer == kAnyPeer; ++i) {
          const int q = (next_peer + i) % size_;
          FrameHeader h;
          if (q == rank_ || pairs_[q]->receiving() || !pairs_[q]->peek(&h)) continue;
          if (h.fingerprint().op != OpKind::kSendRecv || h.seq != p2p_recv_seq_[q]) continue;
          next_peer = (q + 1) % size_;
          op.p2p_peer = q;
          *op.p2p_source = q;
          post(op);
          changed = true;
        }
        if (op.p2p_peer == kAnyPeer) {
          unmatched = true;
          break;
        }
      }
    }
    // Take the sends and receives queued meanwhile (without waiting for the lock).
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      while (!queue_.empty() && queue_.front().p2p_peer != kNoPeer &&
             (queue_.front().p2p_send || !unmatched)) {
        live.push_back(std::move(queue_.front()));
        queue_.pop_front();
        rec.started(live.back().record);
        post(live.back());
        changed = true;
      }
      lock.unlock();
    }
    for (auto it = live.begin(); it != live.end();) {
      if ((it->sreq && it->sreq->done) || (it->rreq && it->rreq->done)) {
        rec.finished(it->record, true);
        it->work->finish(nullptr);
        it = live.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
    if (changed) {
      Deadline d = Deadline::never();
      for (const Op& op : live) d = d.earlier(op.deadline);
      x.set_deadline(d);
    }
    return live.empty();
  };
  try {
    if (!step()) x.progress_until(step);
    x.wait_all();
  } catch (const std::exception& e) {
    for (const Op& op : live) rec.finished(op.record, false);
    std::exception_ptr err = std::current_exception();
    const auto* pe = dynamic_cast<const PeerError*>(&e);
    if (!live.empty() && (pe || dynamic_cast<const InternalError*>(&e))) {
      try {
        fail(live.front(), e);
      } catch (...) {
        err = std::current_exception();
      }
    }
    for (const Op& op : live) op.work->finish(err);
  }
}

void Communicator::validate(int root, const char* what) const {
  if (root < 0 || root >= size_)
    throw UserError(std::string(what) + ": root " + std::to_string(root) +
                        " is not a rank of this communicator (size " + std::to_string(size_) + ")",
                    "pass a root between 0 and size-1");
}

void Communicator::validate_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw UserError(std::string(what) + ": peer " + std::to_string(peer) +
                        " is not another rank of this communicator (rank " + std::to_string(rank_) +
                        ", size " + std::to_string(size_) + ")",
                    "pass a peer between 0 and size-1, other than yourself");
}

// ------------------------------------------------------------------ collectives

namespace {
Fingerprint fingerprint(OpKind op, DType t, ReduceOp r, Algo a, int root, uint64_t count) {
  Fingerprint fp;
  fp.op = op;
  fp.dtype = t;
  fp.redop = r;
  fp.algo = a;
  fp.root = root;
  fp.count = count;
  return fp;
}
}  // namespace

WorkPtr Communicator::allreduce_impl(bool blocking, const void* in, void* out, size_t count,
                                     DType t, ReduceOp op, OpOptions o) {
  const size_t bytes = count * dtype_size(t);
  Algo a = chosen_algo(OpKind::kAllreduce, bytes, o.algo);
  Op p;
  p.fp = fingerprint(OpKind::kAllreduce, t, op, a, -1, count);
  p.timeout_s = o.timeout_s;
  int n = size_;
  return launch(std::move(p), blocking, [=](Exec& x) {
    switch (a) {
      case Algo::kRing:
        algo::allreduce_ring(x, in, out, count);
        break;
      case Algo::kRd:
        algo::allreduce_rd(x, in, out, count);
        break;
      case Algo::kDirect:
        algo::allreduce_direct(x, in, out, count);
        break;
      case Algo::kTree:
        algo::allreduce_tree(x, in, out, count);
        break;
      case Algo::kHier:
        algo::allreduce_hier(x, in, out, count);
        break;
      default:
        LOOM_CHECK_MSG(false, "no allreduce algorithm " + std::string(algo_name(a)));
    }
    if (op == ReduceOp::kAvg) finish_avg(out, count, t, n);
  });
}

namespace {
void allgather_with(Exec& x, Algo a, const void* in, void* out, const algo::Blocks& b) {
  switch (a) {
    case Algo::kRing:
      algo::allgather_ring(x, in, out, b);
      break;
    case Algo::kDirect:
      algo::allgather_direct(x, in, out, b);
      break;
    case Algo::kRd:
      algo::allgather_rd(x, in, out, b);
      break;
    case Algo::kHier:
      algo::allgather_hier(x, in, out, b);
      break;
    default:
      LOOM_CHECK_MSG(false, "no allgather algorithm " + std::string(algo_name(a)));
  }
}
}  // namespace

WorkPtr Communicator::allgatherv_impl(bool blocking, const void* in, void* out,
                                      std::vector<size_t> counts, DType t, OpOptions o) {
  if (counts.size() != static_cast<size_t>(size_))
    throw UserError("allgatherv: " + std::to_string(counts.size()) + " counts for " +
                        std::to_string(size_) + " ranks",
                    "pass one count per rank");
  auto b = algo::blocks_from_counts(counts, dtype_size(t));
  uint64_t total = 0;
  for (size_t c : counts) total += c;
  Algo a = chosen_algo(OpKind::kAllgather, b.total(), o.algo);
  Op p;
  p.fp = fingerprint(OpKind::kAllgather, t, ReduceOp::kSum, a, -1, total);
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking, [=](Exec& x) { allgather_with(x, a, in, out, b); });
}

const algo::Blocks& Communicator::equal_blocks(size_t each) {
  algo::Blocks& b = *equal_blocks_;
  if (b.off.size() != static_cast<size_t>(size_) || (size_ > 0 && b.len[0] != each)) {
    b.off.resize(size_), b.len.assign(size_, each);
    for (int q = 0; q < size_; ++q) b.off[q] = q * each;
  }
  return b;
}

WorkPtr Communicator::allgather_impl(bool blocking, const void* in, void* out, size_t count,
                                     DType t, OpOptions o) {
  // Equal blocks: no per-call vectors (allgatherv's counts and offsets); the body takes the
  // communicator's, which only the running operation touches.
  const size_t each = count * dtype_size(t);
  Algo a = chosen_algo(OpKind::kAllgather, each * size_, o.algo);
  Op p;
  p.fp = fingerprint(OpKind::kAllgather, t, ReduceOp::kSum, a, -1, count * size_);
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking,
                [=, this](Exec& x) { allgather_with(x, a, in, out, equal_blocks(each)); });
}

WorkPtr Communicator::reduce_scatter_impl(bool blocking, const void* in, void* out, size_t count,
                                          DType t, ReduceOp op, OpOptions o) {
  const size_t bytes = count * dtype_size(t) * size_;
  Algo a = chosen_algo(OpKind::kReduceScatter, bytes, o.algo);
  Op p;
  p.fp = fingerprint(OpKind::kReduceScatter, t, op, a, -1, count);
  p.timeout_s = o.timeout_s;
  int n = size_;
  return launch(std::move(p), blocking, [=](Exec& x) {
    switch (a) {
      case Algo::kRing:
        algo::reduce_scatter_ring(x, in, out, count);
        break;
      case Algo::kDirect:
        algo::reduce_scatter_direct(x, in, out, count);
        break;
      case Algo::kRd:
        algo::reduce_scatter_rd(x, in, out, count);
        break;
      case Algo::kHier:
        algo::reduce_scatter_hier(x, in, out, count);
        break;
      default:
        LOOM_CHECK_MSG(false, "no reduce_scatter algorithm " + std::string(algo_name(a)));
    }
    if (op == ReduceOp::kAvg) finish_avg(out, count, t, n);
  });
}

WorkPtr Communicator::broadcast_impl(bool blocking, void* buf, size_t count, DType t, int root,
                                     OpOptions o) {
  validate(root, "broadcast");
  const size_t bytes = count * dtype_size(t);
  Algo a = chosen_algo(OpKind::kBroadcast, bytes, o.algo);
  Op p;
  p.fp = fingerprint(OpKind::kBroadcast, t, ReduceOp::kSum, a, root, count);
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking, [=](Exec& x) {
    switch (a) {
      case Algo::kTree:
        algo::broadcast_tree(x, buf, bytes, root);
        break;
      case Algo::kDirect:
        algo::broadcast_direct(x, buf, bytes, root);
        break;
      case Algo::kRing:
        algo::broadcast_ring(x, buf, bytes, root);
        break;
      default:
        LOOM_CHECK_MSG(false, "no broadcast algorithm " + std::string(algo_name(a)));
    }
  });
}

WorkPtr Communicator::reduce_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                  ReduceOp op, int root, OpOptions o) {
  validate(root, "reduce");
  const size_t bytes = count * dtype_size(t);
  Algo a = chosen_algo(OpKind::kReduce, bytes, o.algo);
  Op p;
  p.fp = fingerprint(OpKind::kReduce, t, op, a, root, count);
  p.timeout_s = o.timeout_s;
  int n = size_, me = rank_;
  return launch(std::move(p), blocking, [=](Exec& x) {
    switch (a) {
      case Algo::kTree:
        algo::reduce_tree(x, in, out, count, root);
        break;
      case Algo::kDirect:
        algo::reduce_direct(x, in, out, count, root);
        break;
      default:
        LOOM_CHECK_MSG(false, "no reduce algorithm " + std::string(algo_name(a)));
    }
    if (op == ReduceOp::kAvg && me == root) finish_avg(out, count, t, n);
  });
}

WorkPtr Communicator::gather_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                  int root, OpOptions o) {
  validate(root, "gather");
  const size_t bytes = count * dtype_size(t);
  Op p;
  p.fp = fingerprint(OpKind::kGather, t, ReduceOp::kSum, Algo::kDirect, root, count);
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking,
                [=](Exec& x) { algo::gather_direct(x, in, out, bytes, root); });
}

WorkPtr Communicator::scatter_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                   int root, OpOptions o) {
  validate(root, "scatter");
  const size_t bytes = count * dtype_size(t);
  Op p;
  p.fp = fingerprint(OpKind::kScatter, t, ReduceOp::kSum, Algo::kDirect, root, count);
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking,
                [=](Exec& x) { algo::scatter_direct(x, in, out, bytes, root); });
}

WorkPtr Communicator::alltoall_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                    OpOptions o) {
  const size_t bytes = count * dtype_size(t);
  Op p;
  p.fp = fingerprint(OpKind::kAlltoall, t, ReduceOp::kSum, Algo::kDirect, -1, count);
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking, [=](Exec& x) { algo::alltoall_direct(x, in, out, bytes); });
}

WorkPtr Communicator::barrier_impl(bool blocking, OpOptions o) {
  Op p;
  p.fp = fingerprint(OpKind::kBarrier, DType::kU8, ReduceOp::kSum, Algo::kRd, -1, 0);
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking, [](Exec& x) { algo::barrier_dissemination(x); });
}

WorkPtr Communicator::allgather_shared_impl(bool blocking, const void* in, MachineBuffer& out,
                                            size_t count, DType t, OpOptions o) {
  const size_t each = count * dtype_size(t);
  const int local = static_cast<int>(topo_.local(rank_).size());
  if (each * size_ > out.size() || (out.size() > 0 && !out.data()) || out.sharers() != local)
    throw UserError("allgather_shared of " + std::to_string(count) +
                        " elements per rank needs a "
                        "machine buffer of this communicator of at least " +
                        std::to_string(each * size_) + " bytes; this one has " +
                        std::to_string(out.size()) + " bytes and " + std::to_string(out.sharers()) +
                        " sharers (the machine has " + std::to_string(local) + " ranks)",
                    "allocate it with this communicator's alloc_machine_buffer(size() * count * "
                    "element size)");
  const auto* a = static_cast<const std::byte*>(in);
  const auto* o0 = static_cast<const std::byte*>(out.data());
  if (each > 0 && a < o0 + out.size() && o0 < a + each)
    throw UserError("allgather_shared's input lies inside its machine buffer",
                    "pass the rank's block from memory of its own: the machine buffer may "
                    "still be read by the other ranks of the machine until they all call it");
  Op p;
  p.fp = fingerprint(OpKind::kAllgatherShared, t, ReduceOp::kSum, Algo::kDirect, -1, count * size_);
  p.timeout_s = o.timeout_s;
  void* dst = out.data();
  const uint64_t id = out.id();
  return launch(std::move(p), blocking,
                [=, this](Exec& x) { algo::allgather_shared(x, in, dst, equal_blocks(each), id); });
}

WorkPtr Communicator::send_impl(bool blocking, const void* buf, size_t count, DType t, int peer,
                                OpOptions o) {
  validate_peer(peer, "send");
  const size_t bytes = count * dtype_size(t);
  Op p;
  p.fp = fingerprint(OpKind::kSendRecv, t, ReduceOp::kSum, Algo::kDirect, -1, count);
  p.timeout_s = o.timeout_s;
  p.p2p_peer = peer;
  p.p2p_send = true;
  p.p2p_buf = static_cast<std::byte*>(const_cast<void*>(buf));  // read only
  p.p2p_bytes = bytes;
  return submit(std::move(p), blocking);
}

WorkPtr Communicator::recv_impl(bool blocking, void* buf, size_t count, DType t, int peer,
                                OpOptions o, int* source) {
  if (source == nullptr) validate_peer(peer, "recv");
  if (source && size_ < 2)
    throw UserError(
        "recv from any source: rank " + std::to_string(rank_) + " is alone in its communicator",
        "receive from any source only in a communicator of 2 or more ranks");
  Op p;
  p.fp = fingerprint(OpKind::kSendRecv, t, ReduceOp::kSum, Algo::kDirect, -1, count);
  p.timeout_s = o.timeout_s;
  p.p2p_peer = source ? kAnyPeer : peer;
  p.p2p_buf = static_cast<std::byte*>(buf);
  p.p2p_bytes = count * dtype_size(t);
  p.p2p_source = source;
  return submit(std::move(p), blocking);
}

// ------------------------------------------------------------------ public forms

WorkPtr Communicator::allreduce_async(const void* in, void* out, size_t count, DType t, ReduceOp op,
                                      OpOptions o) {
  return allreduce_impl(false, in, out, count, t, op, o);
}
void Communicator::allreduce(const void* in, void* out, size_t count, DType t, ReduceOp op,
                             OpOptions o) {
  allreduce_impl(true, in, out, count, t, op, o);
}
WorkPtr Communicator::allgather_async(const void* in, void* out, size_t count, DType t,
                                      OpOptions o) {
  return allgather_impl(false, in, out, count, t, o);
}
void Communicator::allgather(const void* in, void* out, size_t count, DType t, OpOptions o) {
  allgather_impl(true, in, out, count, t, o);
}
WorkPtr Communicator::allgatherv_async(const void* in, void* out, std::vector<size_t> counts,
                                       DType t, OpOptions o) {
  return allgatherv_impl(false, in, out, std::move(counts), t, o);
}
void Communicator::allgatherv(const void* in, void* out, std::vector<size_t> counts, DType t,
                              OpOptions o) {
  allgatherv_impl(true, in, out, std::move(counts), t, o);
}
WorkPtr Communicator::reduce_scatter_async(const void* in, void* out, size_t count, DType t,
                                           ReduceOp op, OpOptions o) {
  return reduce_scatter_impl(false, in, out, count, t, op, o);
}
void Communicator::reduce_scatter(const void* in, void* out, size_t count, DType t, ReduceOp op,
                                  OpOptions o) {
  reduce_scatter_impl(true, in, out, count, t, op, o);
}
WorkPtr Communicator::broadcast_async(void* buf, size_t count, DType t, int root, OpOptions o) {
  return broadcast_impl(false, buf, count, t, root, o);
}
void Communicator::broadcast(void* buf, size_t count, DType t, int root, OpOptions o) {
  broadcast_impl(true, buf, count, t, root, o);
}
WorkPtr Communicator::reduce_async(const void* in, void* out, size_t count, DType t, ReduceOp op,
                                   int root, OpOptions o) {
  return reduce_impl(false, in, out, count, t, op, root, o);
}
void Communicator::reduce(const void* in, void* out, size_t count, DType t, ReduceOp op, int root,
                          OpOptions o) {
  reduce_impl(true, in, out, count, t, op, root, o);
}
WorkPtr Communicator::gather_async(const void* in, void* out, size_t count, DType t, int root,
                                   OpOptions o) {
  return gather_impl(false, in, out, count, t, root, o);
}
void Communicator::gather(const void* in, void* out, size_t count, DType t, int root, OpOptions o) {
  gather_impl(true, in, out, count, t, root, o);
}
WorkPtr Communicator::scatter_async(const void* in, void* out, size_t count, DType t, int root,
                                    OpOptions o) {
  return scatter_impl(false, in, out, count, t, root, o);
}
void Communicator::scatter(const void* in, void* out, size_t count, DType t, int root,
                           OpOptions o) {
  scatter_impl(true, in, out, count, t, root, o);
}
WorkPtr Communicator::alltoall_async(const void* in, void* out, size_t count, DType t,
                                     OpOptions o) {
  return alltoall_impl(false, in, out, count, t, o);
}
void Communicator::alltoall(const void* in, void* out, size_t count, DType t, OpOptions o) {
  alltoall_impl(true, in, out, count, t, o);
}
WorkPtr Communicator::allgather_shared_async(const void* in, MachineBuffer& out, size_t count,
                                             DType t, OpOptions o) {
  return allgather_shared_impl(false, in, out, count, t, o);
}
void Communicator::allgather_shared(const void* in, MachineBuffer& out, size_t count, DType t,
                                    OpOptions o) {
  allgather_shared_impl(true, in, out, count, t, o);
}
WorkPtr Communicator::barrier_async(OpOptions o) {
  return barrier_impl(false, o);
}
void Communicator::barrier(OpOptions o) {
  barrier_impl(true, o);
}
WorkPtr Communicator::send_async(const void* buf, size_t count, DType t, int peer, OpOptions o) {
  return send_impl(false, buf, count, t, peer, o);
}
void Communicator::send(const void* buf, size_t count, DType t, int peer, OpOptions o) {
  send_impl(true, buf, count, t, peer, o);
}
WorkPtr Communicator::recv_async(void* buf, size_t count, DType t, int peer, OpOptions o) {
  return recv_impl(false, buf, count, t, peer, o);
}
void Communicator::recv(void* buf, size_t count, DType t, int peer, OpOptions o) {
  recv_impl(true, buf, count, t, peer, o);
}
WorkPtr Communicator::recv_any_async(void* buf, size_t count, DType t, int* source, OpOptions o) {
  LOOM_CHECK(source != nullptr);
  return recv_impl(false, buf, count, t, kAnyPeer, o, source);
}

}  // namespace loom::comm
