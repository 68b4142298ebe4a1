// Point-to-point: send and receive, and how they run. Unlike a collective, a send or a
// receive does not wait for the operations before it to finish: every one at the front of
// the queue runs together (run_p2p), each with its own deadline and work, and a receive
// from any source is matched to the first pair whose next message is the send it expects.
#include <list>

#include "loom/comm/communicator.h"
#include "loom/comm/flight_recorder.h"
#include "loom/core/error.h"

namespace loom::comm {

WorkPtr Communicator::send_impl(bool blocking, const void* buf, size_t count, DType t, int peer,
                                OpOptions o) {
  validate_peer(peer, "send");
  const size_t bytes = count * dtype_size(t);
  Op p;
  p.fp = {OpKind::kSendRecv, t, ReduceOp::kSum, Algo::kDirect, -1, count};
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
  p.fp = {OpKind::kSendRecv, t, ReduceOp::kSum, Algo::kDirect, -1, count};
  p.timeout_s = o.timeout_s;
  p.p2p_peer = source ? kAnyPeer : peer;
  p.p2p_buf = static_cast<std::byte*>(buf);
  p.p2p_bytes = count * dtype_size(t);
  p.p2p_source = source;
  return submit(std::move(p), blocking);
}

// What run_p2p keeps while its sends and receives are in flight.
struct Communicator::P2pBatch {
  FlightRecorder& rec;
  Exec& x;
  std::list<Op> live;      // posted or waiting for a sender, oldest first
  bool unmatched = false;  // a receive from any source is waiting for its sender
  int next_peer = 0;       // where the search for an any-source sender starts (round robin)
};

// Sends and receives progress together: every one at the front of the queue is posted at
// once, and more are taken from the queue while these run, so that two ranks that each
// post a receive and then a send to the other (torch's batch_isend_irecv) both complete.
// Each finishes its own work as soon as its transfer is done. A receive from any source
// is matched to the first pair whose next incoming message is the send it expects; the
// receives queued behind it wait until it is (messages of a pair arrive in order).
void Communicator::run_p2p(Op first, bool on_caller) {
  FlightRecorder& rec = FlightRecorder::get();
  std::list<Op>* live = nullptr;  // the batch's, for the wait callback below
  Exec x(
      rank_, size_, pairs_, topo_, first.fp, first.seq, Deadline::never(), wait_policy_,
      [&] {
        check_abort();
        if (!live || live->empty()) return;
        std::vector<int> who;
        for (auto& p : pairs_)
          if (p && p->busy()) who.push_back(world_ranks_[p->peer()]);
        rec.waiting(live->front().record, std::move(who));
      },
      scratch_, queues_);
  P2pBatch b{rec, x, {}};
  live = &b.live;
  b.live.push_back(std::move(first));
  if (!on_caller) rec.started(b.live.back().record);
  p2p_post(b, b.live.back());
  x.set_deadline(b.live.back().deadline);
  // One round: match, take more, retire; the deadline is the earliest of those live.
  auto step = [&]() -> bool {
    const bool matched = p2p_match_any_source(b);
    const bool taken = p2p_take_queued(b);
    if (p2p_retire_done(b) || matched || taken) {
      Deadline d = Deadline::never();
      for (const Op& op : b.live) d = d.earlier(op.deadline);
      x.set_deadline(d);
    }
    return b.live.empty();
  };
  try {
    if (!step()) x.progress_until(step);
    x.wait_all();
  } catch (const std::exception& e) {
    for (const Op& op : b.live) rec.finished(op.record, false);
    std::exception_ptr err = std::current_exception();
    const auto* pe = dynamic_cast<const PeerError*>(&e);
    if (!b.live.empty() && (pe || dynamic_cast<const InternalError*>(&e))) {
      try {
        fail(b.live.front(), e);
      } catch (...) {
        err = std::current_exception();
      }
    }
    for (const Op& op : b.live) op.work->finish(err);
  }
}

// Starts op's transfer (a receive takes its sequence number now, in queue order), or marks
// a receive from any source as waiting for its sender.
void Communicator::p2p_post(P2pBatch& b, Op& op) {
  op.deadline = Deadline::after_seconds(op.timeout_s > 0 ? op.timeout_s : cfg_.timeout_s);
  if (op.p2p_send) {
    b.x.set_op(op.fp, op.seq);
    op.sreq = b.x.send(op.p2p_peer, op.p2p_buf, op.p2p_bytes);
  } else if (op.p2p_peer >= 0) {
    op.seq = p2p_recv_seq_[op.p2p_peer]++;
    b.rec.matched(op.record, op.seq, world_ranks_[op.p2p_peer]);
    b.x.set_op(op.fp, op.seq);
    op.rreq = b.x.recv(op.p2p_peer, op.p2p_buf, op.p2p_bytes);
  } else {
    b.unmatched = true;
  }
}

// Receives from any source, oldest first: each to the first pair (round robin) whose next
// message is a send with the sequence number that pair expects. Whether any was matched.
bool Communicator::p2p_match_any_source(P2pBatch& b) {
  if (!b.unmatched) return false;
  bool changed = false;
  b.unmatched = false;
  for (Op& op : b.live) {
    if (op.p2p_peer != kAnyPeer) continue;
    for (int i = 0; i < size_ && op.p2p_peer == kAnyPeer; ++i) {
      const int q = (b.next_peer + i) % size_;
      FrameHeader h;
      if (q == rank_ || pairs_[q]->receiving() || !pairs_[q]->peek(&h)) continue;
      if (h.fingerprint().op != OpKind::kSendRecv || h.seq != p2p_recv_seq_[q]) continue;
      b.next_peer = (q + 1) % size_;
      op.p2p_peer = q;
      *op.p2p_source = q;
      p2p_post(b, op);
      changed = true;
    }
    if (op.p2p_peer == kAnyPeer) {
      b.unmatched = true;
      break;
    }
  }
  return changed;
}

// The sends and receives queued meanwhile (without waiting for the lock; receives only
// while no receive from any source waits). Whether any was taken.
bool Communicator::p2p_take_queued(P2pBatch& b) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  bool changed = false;
  while (!queue_.empty() && queue_.front().p2p_peer != kNoPeer &&
         (queue_.front().p2p_send || !b.unmatched)) {
    b.live.push_back(std::move(queue_.front()));
    queue_.pop_front();
    b.rec.started(b.live.back().record);
    p2p_post(b, b.live.back());
    changed = true;
  }
  return changed;
}

// Finishes the works whose transfers are done. Whether any was.
bool Communicator::p2p_retire_done(P2pBatch& b) {
  bool changed = false;
  for (auto it = b.live.begin(); it != b.live.end();) {
    if ((it->sreq && it->sreq->done) || (it->rreq && it->rreq->done)) {
      b.rec.finished(it->record, true);
      it->work->finish(nullptr);
      it = b.live.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  return changed;
}

}  // namespace loom::comm
