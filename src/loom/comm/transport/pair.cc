#include "loom/comm/transport/pair.h"

#include <cstring>

#include "loom/comm/reduce.h"
#include "loom/core/error.h"

namespace loom::comm {

std::string Fingerprint::str() const {
  std::string s =
      std::string(op_name(op)) + "(" + dtype_name(dtype) + ", count=" + std::to_string(count);
  if (op == OpKind::kAllreduce || op == OpKind::kReduce || op == OpKind::kReduceScatter)
    s += std::string(", op=") + reduce_op_name(redop);
  if (root >= 0) s += ", root=" + std::to_string(root);
  s += std::string(", algo=") + algo_name(algo) + ")";
  return s;
}

FrameHeader FrameHeader::of(const Fingerprint& fp, uint64_t seq, uint64_t bytes) {
  FrameHeader h;
  h.op = static_cast<uint8_t>(fp.op);
  h.dtype = static_cast<uint8_t>(fp.dtype);
  h.redop = static_cast<uint8_t>(fp.redop);
  h.algo = static_cast<uint8_t>(fp.algo);
  h.seq = seq;
  h.count = fp.count;
  h.root = fp.root;
  h.bytes = bytes;
  return h;
}

Fingerprint FrameHeader::fingerprint() const {
  Fingerprint fp;
  fp.op = static_cast<OpKind>(op);
  fp.dtype = static_cast<DType>(dtype);
  fp.redop = static_cast<ReduceOp>(redop);
  fp.algo = static_cast<Algo>(algo);
  fp.root = root;
  fp.count = count;
  return fp;
}

void Pair::deliver_at(RecvReq& r, size_t off, const void* src, size_t len) {
  auto* dst = static_cast<std::byte*>(r.dst) + off;
  if (r.a == nullptr) {
    if (r.streaming)
      copy_streaming(dst, src, len);
    else
      std::memcpy(dst, src, len);
  } else {
    size_t es = dtype_size(r.dtype);
    const auto* a = static_cast<const std::byte*>(r.a) + off;
    if (r.streaming)
      reduce_streaming(dst, a, src, len / es, r.dtype, r.redop);
    else
      reduce_into(dst, a, src, len / es, r.dtype, r.redop);
  }
  r.got += len;
}

void Pair::check_header(const RecvReq& r, const FrameHeader& h) const {
  if (h.magic != kFrameMagic)
    throw PeerError(PeerError::Kind::kProtocol,
                    "rank " + std::to_string(world_self_) + " received a corrupt frame from rank " +
                        std::to_string(world_peer_) + " (bad magic)",
                    peer_);
  Fingerprint theirs = h.fingerprint();
  if (h.seq != r.seq || !(theirs == r.expect)) {
    throw PeerError(PeerError::Kind::kDesync,
                    "collective desync: at sequence number " + std::to_string(r.seq) + " rank " +
                        std::to_string(world_self_) + " called " + r.expect.str() + " but rank " +
                        std::to_string(world_peer_) + " called " + theirs.str() +
                        (h.seq != r.seq ? " as its sequence number " + std::to_string(h.seq) : ""),
                    peer_);
  }
  if (h.bytes != r.bytes)
    throw PeerError(PeerError::Kind::kProtocol,
                    "rank " + std::to_string(world_peer_) + " sent " + std::to_string(h.bytes) +
                        " bytes at sequence number " + std::to_string(r.seq) + " of " +
                        r.expect.str() + "; rank " + std::to_string(world_self_) + " expected " +
                        std::to_string(r.bytes),
                    peer_);
}

}  // namespace loom::comm
