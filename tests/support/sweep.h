// The collective sweep shared by the thread-rank and process-rank tests: every collective
// x algorithm valid here x dtype x reduce op x count, in place and out of place, against
// closed-form values.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/communicator.h"
#include "support/values.h"

namespace loom::test {

using comm::Algo;
using comm::Communicator;
using comm::OpKind;
using comm::OpOptions;
using comm::ReduceOp;

// Where the sweep's buffers come from: the heap, or (sweep_shared) one shared buffer of the
// communicator, so that every message leaves from memory the peers have mapped. A bump
// arena per thread, emptied whenever nothing allocated from it is alive.
struct SweepArena {
  std::byte* base = nullptr;
  size_t cap = 0, used = 0;
  int live = 0;
};
inline thread_local SweepArena* t_sweep_arena = nullptr;

template <class T>
struct SweepAlloc {
  using value_type = T;
  SweepAlloc() = default;
  template <class U>
  SweepAlloc(const SweepAlloc<U>&) {}
  T* allocate(size_t n) {
    SweepArena* a = t_sweep_arena;
    if (!a) return std::allocator<T>().allocate(n);
    size_t b = (n * sizeof(T) + 63) & ~size_t{63};
    if (a->used + b > a->cap) throw std::bad_alloc();
    T* p = reinterpret_cast<T*>(a->base + a->used);
    a->used += b;
    ++a->live;
    return p;
  }
  void deallocate(T* p, size_t n) {
    SweepArena* a = t_sweep_arena;
    auto* b = reinterpret_cast<std::byte*>(p);
    if (a && b >= a->base && b < a->base + a->cap) {
      if (--a->live == 0) a->used = 0;
      return;
    }
    std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const SweepAlloc<U>&) const {
    return true;
  }
};
using Bytes = std::vector<uint8_t, SweepAlloc<uint8_t>>;

inline const DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                                  DType::kI32, DType::kI64,  DType::kU8};
inline const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                   ReduceOp::kProd};

inline std::vector<Algo> algos_to_test(const Communicator& c, OpKind op) {
  std::vector<Algo> v = comm::valid_algos(op, c.topology());
  v.push_back(Algo::kAuto);
  return v;
}

struct Checker {
  int rank;
  std::string where;
  const std::function<void(const std::string&)>& report;
  int failures = 0;
  void expect(double got, double want, size_t i, const std::string& what) {
    if (got == want) return;
    if (failures++ < 3)
      report(where + " " + what + " rank " + std::to_string(rank) + " element " +
             std::to_string(i) + ": got " + std::to_string(got) + " want " + std::to_string(want));
  }
  // Bytes [from, to) of b still hold the poison: nothing was written there.
  void untouched(const Bytes& b, size_t from, size_t to, const std::string& what) {
    for (size_t i = from; i < to; ++i)
      if (b[i] != kPoison) {
        if (failures++ < 3)
          report(where + " " + what + " rank " + std::to_string(rank) + ": byte " +
                 std::to_string(i) + " written (" + std::to_string(b[i]) +
                 "), where the operation must not write");
        return;
      }
  }
  // The guard after the first `bytes` of b is intact (no write past the end).
  void guard_intact(const Bytes& b, size_t bytes, const std::string& what) {
    untouched(b, bytes, b.size(), what + " (past the end)");
  }
  // An input the operation only reads still holds what it held.
  void unchanged(const Bytes& b, const Bytes& before, const std::string& what) {
    if (b != before && failures++ < 3)
      report(where + " " + what + " rank " + std::to_string(rank) + ": its input was modified");
  }

  static constexpr uint8_t kPoison = 0xEE;
  static constexpr size_t kGuard = 64;
};

// A buffer of `bytes` plus a guard, all poisoned (kPoison): the checks above find writes
// past the end and writes where none belong.
inline Bytes guarded(size_t bytes) {
  return Bytes(bytes + Checker::kGuard, Checker::kPoison);
}

inline std::string label(const char* op, Algo a, DType t, size_t count, bool in_place,
                         ReduceOp r = ReduceOp::kSum) {
  return std::string(op) + "/" + comm::algo_name(a) + "/" + dtype_name(t) + "/" +
         comm::reduce_op_name(r) + "/count=" + std::to_string(count) +
         (in_place ? "/in-place" : "/out-of-place");
}

// Runs the sweep; returns the number of wrong results (each also passed to `report`).
inline int sweep(Communicator& c, const std::vector<size_t>& counts, const std::string& where,
                 const std::function<void(const std::string&)>& report) {
  const int n = c.size(), r = c.rank();
  Checker ck{r, where, report};
  for (DType t : kAllTypes) {
    const size_t es = dtype_size(t);
    for (size_t count : counts) {
      for (bool in_place : {false, true}) {
        // allreduce
        for (ReduceOp op : kAllOps) {
          for (Algo a : algos_to_test(c, OpKind::kAllreduce)) {
            auto in = guarded(count * es), out = guarded(count * es);
            fill(t, in.data(), count, op, r);
            const auto before = in;
            void* dst = in_place ? in.data() : out.data();
            c.allreduce(in.data(), dst, count, t, op, OpOptions{a});
            std::string what = label("allreduce", a, t, count, in_place, op);
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, dst, i), as_dtype(t, expected_value(op, t, n, i)), i, what);
            ck.guard_intact(in, count * es, what);
            ck.guard_intact(out, in_place ? 0 : count * es, what);
            if (!in_place) ck.unchanged(in, before, what);
          }
          // reduce_scatter: each rank gets block r of the reduction of n*count inputs.
          for (Algo a : algos_to_test(c, OpKind::kReduceScatter)) {
            auto in = guarded(n * count * es), out = guarded(count * es);
            fill(t, in.data(), n * count, op, r);
            const auto before = in;
            void* dst = in_place ? in.data() + r * count * es : out.data();
            c.reduce_scatter(in.data(), dst, count, t, op, OpOptions{a});
            std::string what = label("reduce_scatter", a, t, count, in_place, op);
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, dst, i), as_dtype(t, expected_value(op, t, n, r * count + i)), i,
                        what);
            ck.guard_intact(in, n * count * es, what);
            ck.guard_intact(out, in_place ? 0 : count * es, what);
            if (!in_place) ck.unchanged(in, before, what);
          }
          // reduce to a root that moves with the count
          for (Algo a : algos_to_test(c, OpKind::kReduce)) {
            int root = static_cast<int>(count % n);
            auto in = guarded(count * es), out = guarded(count * es);
            fill(t, in.data(), count, op, r);
            const auto before = in;
            void* dst = in_place ? in.data() : out.data();
            c.reduce(in.data(), dst, count, t, op, root, OpOptions{a});
            std::string what = label("reduce", a, t, count, in_place, op);
            if (r == root)
              for (size_t i = 0; i < count; ++i)
                ck.expect(load(t, dst, i), as_dtype(t, expected_value(op, t, n, i)), i, what);
            ck.guard_intact(in, count * es, what);
            if (in_place) {
              ck.guard_intact(out, 0, what);
            } else {
              // Only the root's output is written; every input is only read.
              ck.guard_intact(out, r == root ? count * es : 0, what + " (non-root output)");
              ck.unchanged(in, before, what);
            }
          }
        }
        // allgather: block q = rank q's values
        for (Algo a : algos_to_test(c, OpKind::kAllgather)) {
          auto in = guarded(count * es), out = guarded(n * count * es);
          void* src = in_place ? out.data() + r * count * es : in.data();
          fill(t, src, count, ReduceOp::kSum, r);
          const auto before = in;
          c.allgather(src, out.data(), count, t, OpOptions{a});
          std::string what = label("allgather", a, t, count, in_place);
          ck.guard_intact(out, n * count * es, what);
          ck.unchanged(in, before, what);
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, out.data(), q * count + i),
                        as_dtype(t, input_value(ReduceOp::kSum, q, i)), q * count + i, what);
        }
        // broadcast from each root in turn
        for (Algo a : algos_to_test(c, OpKind::kBroadcast)) {
          for (int root = 0; root < n; root += std::max(1, n / 3)) {
            auto buf = guarded(count * es);
            if (r == root) fill(t, buf.data(), count, ReduceOp::kSum, root);
            c.broadcast(buf.data(), count, t, root, OpOptions{a});
            std::string what =
                label("broadcast", a, t, count, false) + "/root=" + std::to_string(root);
            ck.guard_intact(buf, count * es, what);
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, buf.data(), i), as_dtype(t, input_value(ReduceOp::kSum, root, i)),
                        i, what);
          }
        }
        if (in_place) continue;
        // gather / scatter / alltoall (direct only)
        {
          int root = n - 1;
          auto in = guarded(count * es), out = guarded(n * count * es);
          fill(t, in.data(), count, ReduceOp::kSum, r);
          const auto gin = in;
          c.gather(in.data(), out.data(), count, t, root);
          ck.unchanged(in, gin, "gather");
          ck.guard_intact(out, r == root ? n * count * es : 0, "gather (non-root output)");
          if (r == root)
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < count; ++i)
                ck.expect(load(t, out.data(), q * count + i),
                          as_dtype(t, input_value(ReduceOp::kSum, q, i)), i, "gather");
          auto sin = guarded(n * count * es), sout = guarded(count * es);
          if (r == 0) fill(t, sin.data(), n * count, ReduceOp::kSum, 7);
          const auto sbefore = sin;
          c.scatter(sin.data(), sout.data(), count, t, 0);
          ck.unchanged(sin, sbefore, "scatter");
          ck.guard_intact(sout, count * es, "scatter");
          for (size_t i = 0; i < count; ++i)
            ck.expect(load(t, sout.data(), i),
                      as_dtype(t, input_value(ReduceOp::kSum, 7, r * count + i)), i, "scatter");
          // alltoall: rank q sends block p = values(q, p*count + i) to rank p.
          auto ain = guarded(n * count * es), aout = guarded(n * count * es);
          fill(t, ain.data(), n * count, ReduceOp::kSum, r);
          const auto abefore = ain;
          c.alltoall(ain.data(), aout.data(), count, t);
          ck.unchanged(ain, abefore, "alltoall");
          ck.guard_intact(aout, n * count * es, "alltoall");
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, aout.data(), q * count + i),
                        as_dtype(t, input_value(ReduceOp::kSum, q, r * count + i)), i, "alltoall");
        }
      }
    }
  }
  c.barrier();
  return ck.failures;
}

// The sweep with every buffer inside one shared buffer of `c` (Communicator::alloc_shared).
inline int sweep_shared(Communicator& c, const std::vector<size_t>& counts,
                        const std::string& where,
                        const std::function<void(const std::string&)>& report) {
  comm::SharedBuffer mem = c.alloc_shared(4 << 20);
  SweepArena arena{static_cast<std::byte*>(mem.data()), mem.size()};
  t_sweep_arena = &arena;
  int wrong = 0;
  try {
    wrong = sweep(c, counts, where, report);
  } catch (...) {
    t_sweep_arena = nullptr;
    throw;
  }
  t_sweep_arena = nullptr;  // every operation has finished: no peer reads `mem` any more
  // Fresh buffers, one after another: each is mapped by the peers on first use and dropped
  // once freed (the last round's buffers are freed while the next ones are named).
  for (int k = 1; k <= 6; ++k) {
    const size_t count = 1000 * k + 3;
    comm::SharedBuffer mine = c.alloc_shared(count * sizeof(float));
    comm::SharedBuffer all = c.alloc_shared(count * c.size() * sizeof(float));
    for (size_t i = 0; i < count; ++i) mine.as<float>()[i] = static_cast<float>(c.rank() * k + i);
    c.allgather(mine.data(), all.data(), count, DType::kF32);
    for (int q = 0; q < c.size(); ++q)
      for (size_t i = 0; i < count; ++i)
        if (all.as<float>()[q * count + i] != static_cast<float>(q * k + i)) {
          report(where + " fresh shared buffer " + std::to_string(k) + ": wrong element");
          ++wrong;
          q = c.size();
          break;
        }
  }
  return wrong;
}

// allgather_shared against the closed form, round after round into the same machine buffers:
// every dtype size, counts from 0 to past a ring's bytes. After each round rank 0 waits before it
// reads the whole buffer, so a peer that started the next round's writes early (before every rank
// of the machine had called it) would change what rank 0 reads. Returns the wrong results.
inline int sweep_allgather_shared(Communicator& c, const std::string& where,
                                  const std::function<void(const std::string&)>& report) {
  int wrong = 0;
  const int n = c.size(), r = c.rank();
  const std::vector<size_t> counts{0, 1, 7, 1031, 70000};
  for (DType t : {DType::kF32, DType::kBF16, DType::kI64, DType::kU8}) {
    const size_t es = dtype_size(t);
    comm::MachineBuffer buf = c.alloc_machine_buffer(70000 * es * n);
    for (size_t count : counts)
      for (int round = 0; round < 3; ++round) {
        // Element i of rank q's block in round k: byte (q * 31 + k * 7 + i) of every element.
        auto byte_of = [&](int q, size_t i) {
          return static_cast<uint8_t>(q * 31 + round * 7 + i * 13);
        };
        std::vector<uint8_t> in(count * es);
        uint8_t* src = in.data();
        for (size_t i = 0; i < count; ++i) std::memset(src + i * es, byte_of(r, i), es);
        c.allgather_shared(src, buf, count, t);
        if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const uint8_t* all = buf.as<uint8_t>();
        bool ok = true;
        for (int q = 0; q < n && ok; ++q)
          for (size_t i = 0; i < count * es && ok; ++i)
            ok = all[q * count * es + i] == byte_of(q, i / es);
        if (!ok) {
          report(where + " allgather_shared " + dtype_name(t) + " count " + std::to_string(count) +
                 " round " + std::to_string(round) + ": wrong bytes");
          ++wrong;
        }
      }
  }
  c.barrier();
  return wrong;
}

}  // namespace loom::test
