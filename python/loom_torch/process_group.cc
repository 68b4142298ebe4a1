#include "process_group.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <Python.h>

#include <algorithm>
#include <optional>

#include "loom/comm/bootstrap.h"
#include "loom/core/error.h"
#include "loom/core/hmac.h"
#include "shared_allocator.h"

namespace loom_torch {
namespace {

using loom::DType;
using loom::comm::ReduceOp;
using loom::comm::WorkPtr;
using Tensors = std::vector<at::Tensor>;

// ---- conversions and checks; every refusal says what and why ----

std::optional<DType> loom_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return DType::kF32;
    case at::kDouble:
      return DType::kF64;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kHalf:
      return DType::kF16;
    case at::kInt:
      return DType::kI32;
    case at::kLong:
      return DType::kI64;
    case at::kByte:
      return DType::kU8;
    default:
      return std::nullopt;
  }
}

DType dtype_of(const at::Tensor& t, const char* op) {
  const auto d = loom_dtype(t.scalar_type());
  TORCH_CHECK(d, "loom: ", op, ": dtype ", t.scalar_type(),
              " is not supported (loom reduces float32, float64, bfloat16, float16, int32, "
              "int64 and uint8)");
  return *d;
}

// Data movement (broadcast, the gathers, scatter, all-to-all, send/recv) reduces nothing: a
// dtype loom cannot reduce (int8, bool, int16, complex, ...) travels as its bytes.
struct Elems {
  size_t count;
  DType dtype;
};
Elems moved(const at::Tensor& t, int64_t numel) {
  if (const auto d = loom_dtype(t.scalar_type())) return {static_cast<size_t>(numel), *d};
  return {static_cast<size_t>(numel) * t.element_size(), DType::kU8};
}
Elems moved(const at::Tensor& t) {
  return moved(t, t.numel());
}

ReduceOp reduce_of(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProd;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    default:
      TORCH_CHECK(false, "loom: ", what, ": reduce op ", static_cast<int>(op.op_),
                  " is not supported (SUM, AVG, PRODUCT, MIN and MAX are; bitwise and "
                  "pre-multiplied sums are not implemented)");
  }
}

// reduces: the op combines values, so loom must know the dtype (data movement need not).
void check_tensor(const at::Tensor& t, const char* op, bool reduces = true) {
  TORCH_CHECK(t.device().is_cpu(), "loom: ", op, ": tensor on ", t.device(),
              " (loom's transports move CPU memory; no CUDA transport is built)");
  TORCH_CHECK(!t.is_sparse(), "loom: ", op, ": sparse tensors are not supported");
  if (reduces) dtype_of(t, op);
}

const at::Tensor& single(const Tensors& ts, const char* op, bool reduces = true) {
  TORCH_CHECK(ts.size() == 1, "loom: ", op, " takes one tensor per process (got ", ts.size(),
              "); loom drives one device per rank");
  check_tensor(ts[0], op, reduces);
  return ts[0];
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, bool reduces = true) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "loom: ", op, ": dtypes differ (",
              a.scalar_type(), " vs ", b.scalar_type(), ")");
  check_tensor(b, op, reduces);
}

// A contiguous tensor with t's data: t itself, or a copy (then written back after the op).
at::Tensor contig(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

// Adapts torch's store (TCPStore, FileStore, PrefixStore, ...) to loom's rendezvous store.
class TorchStore : public loom::comm::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::string& value) override {
    s_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key, loom::Deadline deadline) override {
    wait({key}, deadline);
    auto v = s_->get(key);
    return std::string(v.begin(), v.end());
  }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    auto v = s_->compareSet(key, std::vector<uint8_t>(expected.begin(), expected.end()),
                            std::vector<uint8_t>(desired.begin(), desired.end()));
    return std::string(v.begin(), v.end());
  }
  bool remove(const std::string& key) override { return s_->deleteKey(key); }
  void wait(const std::vector<std::string>& keys, loom::Deadline deadline) override {
    try {
      s_->wait(keys, std::chrono::milliseconds(std::max(1, deadline.remaining_ms())));
    } catch (const c10::Error& e) {
      throw loom::PeerError(loom::PeerError::Kind::kTimeout,
                            std::string("waiting in torch's store: ") + e.what_without_backtrace());
    }
  }
  bool check(const std::vector<std::string>& keys) override { return s_->check(keys); }
  std::unique_ptr<loom::comm::Store> clone() override { return std::make_unique<TorchStore>(s_); }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
};

}  // namespace

// The Work handle: completes when its loom operations have, on the communicator's worker
// thread, then runs the copy-back step and completes the future (DDP chains on it).
class LoomWork : public c10d::Work {
 public:
  LoomWork(c10d::OpType type, Tensors result)
      : c10d::Work(-1, type),
        result_(std::move(result)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  void add(WorkPtr w) { works_.push_back(std::move(w)); }
  void keep(at::Tensor t) { keep_.push_back(std::move(t)); }
  void then(std::function<void()> post) { post_ = std::move(post); }
  // After the op: write the contiguous staging copy back into the caller's tensor (no-op
  // when the op ran on the tensor itself).
  void copy_back(at::Tensor dst, at::Tensor staged) {
    if (!staged.is_same(dst)) then([dst, staged]() mutable { dst.copy_(staged); });
  }

  // Called once every operation is queued. Operations of one communicator finish in order,
  // so the last one's completion is the whole Work's.
  void start() {
    if (works_.empty()) return complete();
    c10::intrusive_ptr<LoomWork> self = c10::intrusive_ptr<LoomWork>::reclaim_copy(this);
    works_.back()->on_done([self] { self->complete(); });
  }

  void set_source(int rank) { source_ = rank; }
  // A receive from any source: the sender's rank, written before the work completes.
  int* source_slot() { return &source_; }
  int sourceRank() const override { return source_; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  void complete() {
    std::exception_ptr err;
    for (const auto& w : works_)
      if (!err && w->error()) err = w->error();
    if (!err && post_) {
      try {
        post_();
      } catch (...) {
        err = std::current_exception();
      }
    }
    if (err) {  // c10::Error surfaces in Python as RuntimeError with loom's message
      std::string what = "loom: ";
      try {
        std::rethrow_exception(err);
      } catch (const std::exception& e) {
        what += e.what();
      }
      err = std::make_exception_ptr(std::runtime_error(what));
    }
    keep_.clear();
    finish(err);
    if (err)
      future_->setError(err);
    else
      future_->markCompleted(c10::IValue(result_));
  }

  Tensors result_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  std::vector<WorkPtr> works_;
  Tensors keep_;
  std::function<void()> post_;
  int source_ = -1;
};

namespace {
c10::intrusive_ptr<LoomWork> make_work(c10d::OpType type, Tensors result) {
  return c10::make_intrusive<LoomWork>(type, std::move(result));
}
void* ptr(const at::Tensor& t) {
  return t.data_ptr();
}
size_t count_of(const at::Tensor& t) {
  return static_cast<size_t>(t.numel());
}
}  // namespace

ProcessGroupLoom::ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : LOOM_TORCH_BASE(rank, size), timeout_(timeout) {
  auto s = std::make_shared<TorchStore>(store);
  loom::comm::CommConfig cfg = loom::comm::CommConfig::from_env();
  cfg.name = "torch";
  cfg.timeout_s = static_cast<double>(timeout.count()) / 1e3;
  // With loom_torch.use_shared_memory() on every rank, tensors from its minimum on are
  // shared: the fused shared allreduce and reduce-scatter apply from there, not from 1 MiB.
  cfg.shared_from = shared_storage_from();
  // Without LOOM_JOB_TOKEN, rank 0 makes one and passes it through torch's store (which
  // itself is not authenticated: set LOOM_JOB_TOKEN for authenticated joins).
  if (cfg.token.empty()) {
    if (rank == 0) s->set("loom_token", loom::generate_token());
    cfg.token = s->get("loom_token", loom::Deadline::after_seconds(cfg.timeout_s));
  }
  try {
    loom::comm::follow_launcher();  // under `loom run`, die with it
    comm_ = loom::comm::Communicator::create(s, rank, size, cfg);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "loom: could not connect the process group: ", e.what());
  }
}

// The communicator's destructor waits for its worker thread to finish the operations queued,
// and that thread may drop the last reference to a tensor (a Work's, after its operation):
// torch then frees the tensor's Python object, which takes the GIL. Python destroys the group
// holding the GIL, so it lets go of it meanwhile (holding it was a deadlock).
ProcessGroupLoom::~ProcessGroupLoom() {
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* saved = PyEval_SaveThread();
    comm_.reset();
    PyEval_RestoreThread(saved);
  } else {
    comm_.reset();
  }
}

c10::intrusive_ptr<LOOM_TORCH_BASE> ProcessGroupLoom::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<ProcessGroupLoom>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

loom::comm::OpOptions ProcessGroupLoom::op_options(std::chrono::milliseconds timeout) const {
  loom::comm::OpOptions o;
  const auto t = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
  o.timeout_s = static_cast<double>(t.count()) / 1e3;
  return o;
}

void ProcessGroupLoom::check_root(int64_t root, const char* op) const {
  TORCH_CHECK(root >= 0 && root < size_, "loom: ", op, ": root ", root,
              " is not a rank of this group of ", size_);
}

// ---- collectives ----

ProcessGroupLoom::Work ProcessGroupLoom::broadcast(Tensors& tensors,
                                                   const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast", false);
  check_root(opts.rootRank, "broadcast");
  auto w = make_work(c10d::OpType::BROADCAST, tensors);
  at::Tensor c = contig(t);
  w->keep(c);
  const Elems e = moved(c);
  w->add(comm_->broadcast_async(ptr(c), e.count, e.dtype, static_cast<int>(opts.rootRank),
                                op_options(opts.timeout)));
  w->copy_back(t, c);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::allreduce(Tensors& tensors,
                                                   const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "allreduce");
  auto w = make_work(c10d::OpType::ALLREDUCE, tensors);
  at::Tensor c = contig(t);
  w->keep(c);
  w->add(comm_->allreduce_async(ptr(c), ptr(c), count_of(c), dtype_of(t, "allreduce"),
                                reduce_of(opts.reduceOp, "allreduce"), op_options(opts.timeout)));
  w->copy_back(t, c);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::allreduce_coalesced(
    Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "loom: allreduce_coalesced: no tensors");
  for (const auto& t : tensors) check_same(tensors[0], t, "allreduce_coalesced");
  Tensors flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flat_parts);  // one reduction for all of them
  auto w = make_work(c10d::OpType::ALLREDUCE_COALESCED, tensors);
  w->keep(flat);
  w->add(comm_->allreduce_async(
      ptr(flat), ptr(flat), count_of(flat), dtype_of(flat, "allreduce_coalesced"),
      reduce_of(opts.reduceOp, "allreduce_coalesced"), op_options(opts.timeout)));
  w->then([tensors, flat]() mutable {
    int64_t at = 0;
    for (auto& t : tensors) {
      t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  });
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  const bool root = opts.rootRank == rank_;
  auto w = make_work(c10d::OpType::REDUCE, tensors);
  at::Tensor c = contig(t);
  at::Tensor out = root ? c : at::empty_like(c);  // non-roots keep their input
  w->keep(c);
  w->keep(out);
  w->add(comm_->reduce_async(ptr(c), ptr(out), count_of(c), dtype_of(t, "reduce"),
                             reduce_of(opts.reduceOp, "reduce"), static_cast<int>(opts.rootRank),
                             op_options(opts.timeout)));
  if (root) w->copy_back(t, c);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                                                   const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "allgather", false);
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "loom: allgather: expected one list of ", size_, " output tensors");
  for (const auto& o : outputs[0]) {
    check_same(in, o, "allgather", false);
    TORCH_CHECK(o.numel() == in.numel(), "loom: allgather: output tensors must have the input's ",
                in.numel(), " elements (got ", o.numel(), ")");
  }
  at::Tensor c = contig(in);
  at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
  auto w = make_work(c10d::OpType::ALLGATHER, outputs[0]);
  w->keep(c);
  w->keep(flat);
  const Elems e = moved(c);
  w->add(comm_->allgather_async(ptr(c), ptr(flat), e.count, e.dtype, op_options(opts.timeout)));
  Tensors outs = outputs[0];
  w->then([outs, flat, n = in.numel()]() mutable {
    for (size_t i = 0; i < outs.size(); ++i)
      outs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[i].sizes()));
  });
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                         const c10d::AllgatherOptions& opts) {
  check_tensor(input, "all_gather_into_tensor", false);
  check_same(input, output, "all_gather_into_tensor", false);
  TORCH_CHECK(output.numel() == input.numel() * size_, "loom: all_gather_into_tensor: output has ",
              output.numel(), " elements, expected ", size_, " x ", input.numel());
  auto w = make_work(c10d::OpType::_ALLGATHER_BASE, {output});
  at::Tensor c = contig(input), o = contig(output);
  w->keep(c);
  w->keep(o);
  const Elems e = moved(c);
  w->add(comm_->allgather_async(ptr(c), ptr(o), e.count, e.dtype, op_options(opts.timeout)));
  w->copy_back(output, o);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::allgather_coalesced(std::vector<Tensors>& outputs,
                                                             Tensors& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == static_cast<size_t>(size_), "loom: allgather_coalesced: expected ",
              size_, " output lists");
  Tensors flats, result;
  auto w = make_work(c10d::OpType::ALLGATHER_COALESCED, {});
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "allgather_coalesced", false);
    at::Tensor c = contig(inputs[i]);
    at::Tensor flat = at::empty({size_ * c.numel()}, c.options());
    w->keep(c);
    w->keep(flat);
    flats.push_back(flat);
    const Elems e = moved(c);
    w->add(comm_->allgather_async(ptr(c), ptr(flat), e.count, e.dtype, op_options(opts.timeout)));
  }
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(outputs[r].size() == inputs.size(), "loom: allgather_coalesced: output list ", r,
                " has ", outputs[r].size(), " tensors, expected ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_same(inputs[i], outputs[r][i], "allgather_coalesced", false);
      TORCH_CHECK(outputs[r][i].numel() == inputs[i].numel(),
                  "loom: allgather_coalesced: output sizes must match the inputs'");
    }
  }
  w->then([outputs, flats]() mutable {
    for (size_t r = 0; r < outputs.size(); ++r)
      for (size_t i = 0; i < flats.size(); ++i) {
        const int64_t n = outputs[r][i].numel();
        outputs[r][i].copy_(
            flats[i].narrow(0, static_cast<int64_t>(r) * n, n).view(outputs[r][i].sizes()));
      }
  });
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::gather(std::vector<Tensors>& outputs, Tensors& inputs,
                                                const c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather", false);
  check_root(opts.rootRank, "gather");
  const bool root = opts.rootRank == rank_;
  if (root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "loom: gather: the root needs one list of ", size_, " output tensors");
    for (const auto& o : outputs[0]) {
      check_same(in, o, "gather", false);
      TORCH_CHECK(o.numel() == in.numel(), "loom: gather: output sizes must match the input's");
    }
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                "loom: gather: only the root passes output tensors");
  }
  at::Tensor c = contig(in);
  at::Tensor flat = root ? at::empty({size_ * in.numel()}, in.options()) : at::Tensor();
  auto w = make_work(c10d::OpType::GATHER, root ? outputs[0] : Tensors{});
  w->keep(c);
  if (root) w->keep(flat);
  const Elems e = moved(c);
  w->add(comm_->gather_async(ptr(c), root ? ptr(flat) : nullptr, e.count, e.dtype,
                             static_cast<int>(opts.rootRank), op_options(opts.timeout)));
  if (root) {
    Tensors outs = outputs[0];
    w->then([outs, flat, n = in.numel()]() mutable {
      for (size_t i = 0; i < outs.size(); ++i)
        outs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[i].sizes()));
    });
  }
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                                 const c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter", false);
  check_root(opts.rootRank, "scatter");
  const bool root = opts.rootRank == rank_;
  at::Tensor flat;
  if (root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "loom: scatter: the root needs one list of ", size_, " input tensors");
    Tensors parts;
    for (const auto& i : inputs[0]) {
      check_same(out, i, "scatter", false);
      TORCH_CHECK(i.numel() == out.numel(), "loom: scatter: input sizes must match the output's");
      parts.push_back(i.reshape({-1}));
    }
    flat = at::cat(parts);
  }
  at::Tensor o = contig(out);
  auto w = make_work(c10d::OpType::SCATTER, outputs);
  w->keep(o);
  if (root) w->keep(flat);
  const Elems e = moved(o);
  w->add(comm_->scatter_async(root ? ptr(flat) : nullptr, ptr(o), e.count, e.dtype,
                              static_cast<int>(opts.rootRank), op_options(opts.timeout)));
  w->copy_back(out, o);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::reduce_scatter(Tensors& outputs,
                                                        std::vector<Tensors>& inputs,
                                                        const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "loom: reduce_scatter: expected one list of ", size_, " input tensors");
  Tensors parts;
  for (const auto& i : inputs[0]) {
    check_same(out, i, "reduce_scatter");
    TORCH_CHECK(i.numel() == out.numel(),
                "loom: reduce_scatter: input sizes must match the output's");
    parts.push_back(i.reshape({-1}));
  }
  at::Tensor flat = at::cat(parts);
  at::Tensor o = contig(out);
  auto w = make_work(c10d::OpType::REDUCE_SCATTER, outputs);
  w->keep(flat);
  w->keep(o);
  w->add(comm_->reduce_scatter_async(
      ptr(flat), ptr(o), count_of(o), dtype_of(out, "reduce_scatter"),
      reduce_of(opts.reduceOp, "reduce_scatter"), op_options(opts.timeout)));
  w->copy_back(out, o);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(input, "reduce_scatter_tensor");
  check_same(input, output, "reduce_scatter_tensor");
  TORCH_CHECK(input.numel() == output.numel() * size_, "loom: reduce_scatter_tensor: input has ",
              input.numel(), " elements, expected ", size_, " x ", output.numel());
  at::Tensor c = contig(input), o = contig(output);
  auto w = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
  w->keep(c);
  w->keep(o);
  w->add(comm_->reduce_scatter_async(
      ptr(c), ptr(o), count_of(o), dtype_of(output, "reduce_scatter_tensor"),
      reduce_of(opts.reduceOp, "reduce_scatter_tensor"), op_options(opts.timeout)));
  w->copy_back(output, o);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::alltoall_padded(c10d::OpType type, Tensors in, Tensors out,
                                                         Tensors results,
                                                         std::chrono::milliseconds timeout) {
  // Every rank must use the same block size: the largest block any rank sends.
  int64_t mine = 0;
  for (const auto& t : in) mine = std::max(mine, t.numel());
  comm_->allreduce(&mine, &mine, 1, DType::kI64, ReduceOp::kMax, op_options(timeout));
  const int64_t block = mine;
  const auto opt = in[0].options();
  at::Tensor send = at::zeros({size_ * block}, opt), recv = at::empty({size_ * block}, opt);
  for (int r = 0; r < size_; ++r)
    send.narrow(0, r * block, in[r].numel()).copy_(in[r].reshape({-1}));
  auto w = make_work(type, std::move(results));
  w->keep(send);
  w->keep(recv);
  const Elems e = moved(send, block);
  w->add(comm_->alltoall_async(ptr(send), ptr(recv), e.count, e.dtype, op_options(timeout)));
  w->then([out, recv, block]() mutable {
    for (size_t r = 0; r < out.size(); ++r)
      out[r].copy_(
          recv.narrow(0, static_cast<int64_t>(r) * block, out[r].numel()).view(out[r].sizes()));
  });
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                       std::vector<int64_t>& output_splits,
                                                       std::vector<int64_t>& input_splits,
                                                       const c10d::AllToAllOptions& opts) {
  check_tensor(input, "all_to_all_single", false);
  check_same(input, output, "all_to_all_single", false);
  if (output_splits.empty() && input_splits.empty()) {
    TORCH_CHECK(input.numel() % size_ == 0 && output.numel() == input.numel(),
                "loom: all_to_all_single: without splits, input and output must have the same "
                "number of elements, divisible by the group size ",
                size_);
    at::Tensor c = contig(input), o = contig(output);
    auto w = make_work(c10d::OpType::ALLTOALL_BASE, {output});
    w->keep(c);
    w->keep(o);
    const Elems e = moved(c, c.numel() / size_);
    w->add(comm_->alltoall_async(ptr(c), ptr(o), e.count, e.dtype, op_options(opts.timeout)));
    w->copy_back(output, o);
    w->start();
    return w;
  }
  // Splits count rows of dimension 0.
  const int64_t rows_in = input.size(0), rows_out = output.size(0);
  auto even = [&](int64_t rows) { return std::vector<int64_t>(size_, rows / size_); };
  std::vector<int64_t> is = input_splits.empty() ? even(rows_in) : input_splits;
  std::vector<int64_t> os = output_splits.empty() ? even(rows_out) : output_splits;
  TORCH_CHECK(static_cast<int>(is.size()) == size_ && static_cast<int>(os.size()) == size_,
              "loom: all_to_all_single: splits must have one entry per rank (", size_, ")");
  Tensors in, out;
  int64_t a = 0, b = 0;
  for (int r = 0; r < size_; ++r) {
    in.push_back(input.narrow(0, a, is[r]));
    out.push_back(output.narrow(0, b, os[r]));
    a += is[r];
    b += os[r];
  }
  TORCH_CHECK(a == rows_in && b == rows_out,
              "loom: all_to_all_single: splits do not add up to the tensors' first dimension");
  return alltoall_padded(c10d::OpType::ALLTOALL_BASE, in, out, {output}, opts.timeout);
}

ProcessGroupLoom::Work ProcessGroupLoom::alltoall(Tensors& outputs, Tensors& inputs,
                                                  const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
              "loom: all_to_all: expected ", size_, " input and ", size_, " output tensors");
  for (int r = 0; r < size_; ++r) {
    check_same(inputs[0], inputs[r], "all_to_all", false);
    check_same(inputs[0], outputs[r], "all_to_all", false);
  }
  return alltoall_padded(c10d::OpType::ALLTOALL, inputs, outputs, outputs, opts.timeout);
}

// ---- point to point: messages between two ranks are matched in the order they are sent
// (loom sequences each pair); the tag is not used for matching ----

ProcessGroupLoom::Work ProcessGroupLoom::send(Tensors& tensors, int dst, int /*tag*/) {
  const at::Tensor& t = single(tensors, "send", false);
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "loom: send: peer ", dst,
              " is not another rank of this group of ", size_);
  at::Tensor c = contig(t);
  auto w = make_work(c10d::OpType::SEND, tensors);
  w->keep(c);
  const Elems e = moved(c);
  w->add(comm_->send_async(ptr(c), e.count, e.dtype, dst, op_options(timeout_)));
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::recv(Tensors& tensors, int src, int /*tag*/) {
  const at::Tensor& t = single(tensors, "recv", false);
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "loom: recv: peer ", src,
              " is not another rank of this group of ", size_);
  at::Tensor c = contig(t);
  auto w = make_work(c10d::OpType::RECV, tensors);
  w->set_source(src);
  w->keep(c);
  const Elems e = moved(c);
  w->add(comm_->recv_async(ptr(c), e.count, e.dtype, src, op_options(timeout_)));
  w->copy_back(t, c);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::recvAnysource(Tensors& tensors, int /*tag*/) {
  const at::Tensor& t = single(tensors, "recv", false);
  TORCH_CHECK(size_ > 1, "loom: recv from any source in a group of one rank would wait forever");
  at::Tensor c = contig(t);
  auto w = make_work(c10d::OpType::RECVANYSOURCE, tensors);
  w->keep(c);
  const Elems e = moved(c);
  w->add(comm_->recv_any_async(ptr(c), e.count, e.dtype, w->source_slot(), op_options(timeout_)));
  w->copy_back(t, c);
  w->start();
  return w;
}

ProcessGroupLoom::Work ProcessGroupLoom::barrier(const c10d::BarrierOptions& opts) {
  auto w = make_work(c10d::OpType::BARRIER, {});
  w->add(comm_->barrier_async(op_options(opts.timeout)));
  w->start();
  return w;
}

void ProcessGroupLoom::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const auto ms = std::to_string(timeout.count());
  uint8_t token = 1;
  if (rank_ != 0) {
    try {
      comm_->send(&token, 1, DType::kU8, 0, op_options(timeout));
      comm_->recv(&token, 1, DType::kU8, 0, op_options(timeout));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "Rank ", rank_,
                  " successfully reached monitoredBarrier, but received errors while waiting for "
                  "send/recv from rank 0. Please check rank 0 logs for faulty rank. (loom: ",
                  e.what(), ")");
    }
    return;
  }
  TORCH_CHECK(timeout.count() > 0, "Rank 0 timed out in monitoredBarrier after ", ms, " ms.");
  const auto deadline = loom::Deadline::after(timeout);
  std::vector<uint8_t> got(size_);
  std::vector<loom::comm::WorkPtr> works(size_);
  for (int r = 1; r < size_; ++r)
    works[r] = comm_->recv_async(&got[r], 1, DType::kU8, r, op_options(timeout));
  std::vector<int> failed;
  for (int r = 1; r < size_; ++r) {
    try {
      works[r]->wait(deadline);
    } catch (const std::exception&) {
      failed.push_back(r);
      if (!wait_all_ranks) break;
    }
  }
  if (!failed.empty()) {
    std::string who = failed.size() == 1 ? "Rank " : "Ranks ";
    for (size_t i = 0; i < failed.size(); ++i) who += (i ? ", " : "") + std::to_string(failed[i]);
    TORCH_CHECK(false, who, " failed to pass monitoredBarrier in ", ms,
                " ms (loom: the group is unusable now; create a new one to go on)");
  }
  for (int r = 1; r < size_; ++r) comm_->send(&token, 1, DType::kU8, r, op_options(timeout));
}

}  // namespace loom_torch
