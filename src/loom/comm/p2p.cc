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

}  // namespace loom::comm
