#include "loom/comm/communicator.h"

// The communicator's public API and its scheduling: operations queued and run in call
// order (on the caller's thread when idle, else on the worker), failures turned into a
// broken communicator and the job's abort record, splits. Elsewhere: how its pairs are
// wired (wiring.cc), shared and machine buffers (shared_buffers.cc), sends and receives
// (p2p.cc), the algorithms and their table (algorithms/).
#include <algorithm>
#include <cstring>
#include <mutex>

#include "loom/comm/algorithms/table.h"
#include "loom/comm/flight_recorder.h"
#include "loom/comm/reduce.h"
#include "loom/comm/store/prefix_store.h"
#include "loom/comm/transport/shm/shm_pair.h"
#include "loom/core/check.h"
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
const StringTunable kAlgo("LOOM_ALGO", "auto",
                          "force an algorithm: auto|ring|direct|tree|rd|hier|shared");
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

std::shared_ptr<Communicator> Communicator::split(int color, int key, size_t shm_ring_bytes) {
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
  cfg.shm_ring_bytes = shm_ring_bytes;
  auto ns = std::make_shared<PrefixStore>(sub, store_);
  std::shared_ptr<Communicator> c(
      new Communicator(root_store_, ns, new_rank, static_cast<int>(members.size()), cfg));
  for (size_t i = 0; i < members.size(); ++i) c->world_ranks_[i] = world_ranks_[members[i]];
  c->connect(Deadline::after_seconds(cfg.timeout_s));
  return c;
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
  if (!watch_store_->check({key})) {
    forget_abort_seen();  // another job's record (or none)
    return;
  }
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
    if (job_abort_seen()) check_abort();  // e.g. a rank silent (LOOM_HEARTBEAT_S)
    body(x);
  } catch (const std::exception& e) {
    record_end(false);
    const auto* pe = dynamic_cast<const PeerError*>(&e);
    if (pe || dynamic_cast<const InternalError*>(&e)) fail(op, e);
    throw;
  }
  record_end(true);
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

// Every collective takes this one path: its algorithm (the call's, LOOM_ALGO's, or the
// tuning table's choice for this op and size), the fingerprint every rank checks, the
// deadline, then the algorithm's row of the table run on the caller's thread or the worker;
// an average divides the reduced sum where the result lands.
WorkPtr Communicator::collective(bool blocking, OpKind kind, DType t, ReduceOp redop,
                                 uint64_t fp_count, size_t choice_bytes, algo::CollArgs args,
                                 OpOptions o, size_t equal_block_bytes) {
  const Algo a = chosen_algo(kind, choice_bytes, o.algo);
  const algo::AlgoRow* row = algo::find_algo(kind, a);
  LOOM_CHECK_MSG(row && row->run,
                 std::string("no ") + op_name(kind) + " algorithm " + algo_name(a));
  Op p;
  p.fp = {kind, t, redop, a, args.root, fp_count};
  p.timeout_s = o.timeout_s;
  const bool average = redop == ReduceOp::kAvg && (kind != OpKind::kReduce || rank_ == args.root);
  const int n = size_;
  const bool blocks = kind == OpKind::kAllgather || kind == OpKind::kAllgatherShared;
  return launch(std::move(p), blocking, [=, this](Exec& x) mutable {
    // Equal blocks are the communicator's, touched only by the running operation.
    if (blocks) args.blocks = &equal_blocks(equal_block_bytes);
    row->run(x, args);
    if (average) finish_avg(args.out, args.count, t, n);
  });
}

WorkPtr Communicator::allreduce_impl(bool blocking, const void* in, void* out, size_t count,
                                     DType t, ReduceOp op, OpOptions o) {
  return collective(blocking, OpKind::kAllreduce, t, op, count, count * dtype_size(t),
                    {.in = in, .out = out, .count = count}, o);
}

WorkPtr Communicator::allgatherv_impl(bool blocking, const void* in, void* out,
                                      std::vector<size_t> counts, DType t, OpOptions o) {
  if (counts.size() != static_cast<size_t>(size_))
    throw UserError("allgatherv: " + std::to_string(counts.size()) + " counts for " +
                        std::to_string(size_) + " ranks",
                    "pass one count per rank");
  // The blocks live as long as the operation: a queued one outlives this call.
  auto b = std::make_shared<const algo::Blocks>(algo::blocks_from_counts(counts, dtype_size(t)));
  uint64_t total = 0;
  for (size_t c : counts) total += c;
  const Algo a = chosen_algo(OpKind::kAllgather, b->total(), o.algo);
  const algo::AlgoRow* row = algo::find_algo(OpKind::kAllgather, a);
  LOOM_CHECK_MSG(row && row->run, std::string("no allgather algorithm ") + algo_name(a));
  Op p;
  p.fp = {OpKind::kAllgather, t, ReduceOp::kSum, a, -1, total};
  p.timeout_s = o.timeout_s;
  return launch(std::move(p), blocking,
                [=](Exec& x) { row->run(x, {.in = in, .out = out, .blocks = b.get()}); });
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
  // Equal blocks: no per-call vectors (allgatherv's counts and offsets).
  const size_t each = count * dtype_size(t);
  return collective(blocking, OpKind::kAllgather, t, ReduceOp::kSum, count * size_, each * size_,
                    {.in = in, .out = out}, o, each);
}

WorkPtr Communicator::reduce_scatter_impl(bool blocking, const void* in, void* out, size_t count,
                                          DType t, ReduceOp op, OpOptions o) {
  return collective(blocking, OpKind::kReduceScatter, t, op, count, count * dtype_size(t) * size_,
                    {.in = in, .out = out, .count = count}, o);
}

WorkPtr Communicator::broadcast_impl(bool blocking, void* buf, size_t count, DType t, int root,
                                     OpOptions o) {
  validate(root, "broadcast");
  const size_t bytes = count * dtype_size(t);
  return collective(blocking, OpKind::kBroadcast, t, ReduceOp::kSum, count, bytes,
                    {.out = buf, .bytes = bytes, .root = root}, o);
}

WorkPtr Communicator::reduce_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                  ReduceOp op, int root, OpOptions o) {
  validate(root, "reduce");
  return collective(blocking, OpKind::kReduce, t, op, count, count * dtype_size(t),
                    {.in = in, .out = out, .count = count, .root = root}, o);
}

WorkPtr Communicator::gather_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                  int root, OpOptions o) {
  validate(root, "gather");
  const size_t bytes = count * dtype_size(t);
  return collective(blocking, OpKind::kGather, t, ReduceOp::kSum, count, bytes,
                    {.in = in, .out = out, .bytes = bytes, .root = root}, o);
}

WorkPtr Communicator::scatter_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                   int root, OpOptions o) {
  validate(root, "scatter");
  const size_t bytes = count * dtype_size(t);
  return collective(blocking, OpKind::kScatter, t, ReduceOp::kSum, count, bytes,
                    {.in = in, .out = out, .bytes = bytes, .root = root}, o);
}

WorkPtr Communicator::alltoall_impl(bool blocking, const void* in, void* out, size_t count, DType t,
                                    OpOptions o) {
  const size_t bytes = count * dtype_size(t);
  return collective(blocking, OpKind::kAlltoall, t, ReduceOp::kSum, count, bytes,
                    {.in = in, .out = out, .bytes = bytes}, o);
}

WorkPtr Communicator::barrier_impl(bool blocking, OpOptions o) {
  return collective(blocking, OpKind::kBarrier, DType::kU8, ReduceOp::kSum, 0, 0, {}, o);
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
  return collective(blocking, OpKind::kAllgatherShared, t, ReduceOp::kSum, count * size_, 0,
                    {.in = in, .out = out.data(), .buffer_id = out.id()}, o, each);
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

TransportStats transport_stats() {
  TransportStats s;
  s.bytes_read_in_place = ShmPair::bytes_read_in_place() + algo::shared_bytes_read();
  return s;
}

}  // namespace loom::comm
