// Memory the ranks of a machine share (communicator.h: SharedBuffer, MachineBuffer): a
// shared buffer is a memfd this process allocates and the machine's other ranks map on
// first use (transport/shm/shared_memory.h); a machine buffer is one such buffer per
// machine, allocated by its first rank and mapped by the others through the communicator.
#include <unistd.h>

#include "loom/comm/communicator.h"
#include "loom/comm/transport/shm/shared_memory.h"
#include "loom/core/check.h"
#include "loom/core/error.h"

namespace loom::comm {

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

}  // namespace loom::comm
